package regiond

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ration-dev/ration/lease/rlqs"
	"github.com/ration-dev/ration/policy"
)

// rlqsPolicy is one global rule for Envoy's domain "edge", keyed by tenant:
// L = 300 requests/s, b = 300.
const rlqsPolicy = `rules:
  - name: edge-tenant
    match: { domain: edge }
    key: [tenant]
    limit: 300
    period: 1s
    burst: 300
`

// rlqsMaxFill is a token bucket's capacity in fills (max_tokens is half
// of tokens_per_fill, rounded up).
const rlqsMaxFill = 500 * time.Millisecond

var rlqsKey = policy.StoreKey("edge-tenant", "tenant=acme")

const (
	rlqsL     = 300
	rlqsBurst = 300
	rlqsTTL   = 2 * time.Second
	rlqsSlack = 500 * time.Millisecond
)

// rlqsRates are the proxies' admissions per second over the last 2 s.
func rlqsRates(ps []*envoyProxy, now time.Time) []float64 {
	out := make([]float64, len(ps))
	for i, p := range ps {
		out[i] = p.own.recent(now, 2*time.Second)
	}
	return out
}

// follows reports whether proxies admitting rates follow their demands
// in a region that can admit capacity per second: each admits at least
// 60% of its demand scaled down to the capacity, and all together at least
// 75% of the smaller of their demand and the capacity.
func follows(rates, demands []float64, capacity float64) bool {
	scale := min(1, capacity/sum(demands))
	for i := range rates {
		if rates[i] < 0.6*demands[i]*scale {
			return false
		}
	}
	return sum(rates) >= 0.75*min(sum(demands), capacity)
}

func sum(xs []float64) (s float64) {
	for _, x := range xs {
		s += x
	}
	return s
}

// TestRLQSTwoRegionsSkewedDemand runs Envoy's RLQS end to end: two regions
// (regiond daemons with their own Redis, exchanging over embedded NATS),
// three proxies each (envoyProxy), one global rule of 300 requests/s, with
// demand skewed to eu, then to us; then us's largest proxy loses its stream
// and later reconnects. The proxies, running the token buckets they were
// assigned, follow demand within a few report intervals (us's whole demand
// met while eu takes the rest); the proxies left in us take over the
// disconnected one's part once its TTL ends; and in every window of 1 s,
// 5 s and 10 s everything the six proxies admitted stays within L·W + B,
// B = b + L·(TTL + slack + fill interval) (docs/RLQS.md).
func TestRLQSTwoRegionsSkewedDemand(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about a minute of real time")
	}
	dep := newDeployment(t, "eu", "us")
	for _, r := range dep.regions {
		dep.addWith(r, r+"-1", func(c *Config) {
			c.PolicyYAML = []byte(rlqsPolicy)
			c.RLQSListen = "127.0.0.1:0"
			c.RLQS = func(rc *rlqs.Config) {
				rc.TTL, rc.Slack = rlqsTTL, rlqsSlack
			}
		})
	}
	l := &ledger{start: time.Now()}
	const every = 2 * time.Second // reports; Envoy's own cadence is 5 s
	proxies := map[string][]*envoyProxy{}
	heavy, light := []float64{200, 100, 50}, []float64{30, 20, 10}
	for _, r := range dep.regions {
		rates := light
		if r == "eu" {
			rates = heavy
		}
		for _, rate := range rates {
			proxies[r] = append(proxies[r], startEnvoyProxy(t, dep.nodes[r][0].RLQSAddr(), "edge", "acme", rate, every, l))
		}
	}
	// Waits until the proxies' admission rates over the last 2 s satisfy
	// ok, failing after a deadline.
	waitRates := func(what string, within time.Duration, ok func(eu, us []float64) bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		logged := time.Now()
		for {
			now := time.Now()
			eu, us := rlqsRates(proxies["eu"], now), rlqsRates(proxies["us"], now)
			if ok(eu, us) {
				t.Logf("%s: eu %.0f %v, us %.0f %v", what, sum(eu), round(eu), sum(us), round(us))
				return
			}
			if now.Sub(logged) >= 2*time.Second {
				logged = now
				sh := map[string]int64{}
				for _, r := range dep.regions {
					sh[r], _ = dep.nodes[r][0].Share(context.Background(), rlqsKey)
				}
				t.Logf("  %s: shares %v, eu %.0f %v %s, us %.0f %v %s", what, sh, sum(eu), round(eu), strategies(proxies["eu"]), sum(us), round(us), strategies(proxies["us"]))
			}
			if now.After(deadline) {
				t.Fatalf("%s: not within %v: eu %.0f %v, us %.0f %v", what, within, sum(eu), round(eu), sum(us), round(us))
			}
			time.Sleep(100 * time.Millisecond) // polling interval, not a wait for an event
		}
	}

	// eu wants 350/s, us 60/s: us's demand is met, eu takes most of the rest.
	waitRates("skewed to eu", 20*time.Second, func(eu, us []float64) bool {
		return follows(us, light, rlqsL) && follows(eu, heavy, rlqsL-60)
	})
	// The skew turns: us wants 350/s, eu 60/s.
	for i, p := range proxies["eu"] {
		p.setRate(light[i])
	}
	for i, p := range proxies["us"] {
		p.setRate(heavy[i])
	}
	waitRates("skewed to us", 20*time.Second, func(eu, us []float64) bool {
		return follows(eu, light, rlqsL) && sum(eu) <= 1.1*60 && follows(us, heavy, rlqsL-60)
	})
	// us's largest proxy loses its stream: it keeps enforcing its
	// assignment until the TTL ends, then denies. The others' 150/s fit in
	// us's share and are met within a few intervals after that TTL.
	proxies["us"][0].disconnect()
	waitRates("us's proxy gone", rlqsTTL+rlqsSlack+10*time.Second, func(eu, us []float64) bool {
		return us[0] == 0 && follows(us[1:], heavy[1:], rlqsL-60)
	})
	// It comes back and re-reports: it is served again.
	proxies["us"][0].reconnect()
	waitRates("us's proxy back", 20*time.Second, func(eu, us []float64) bool {
		return follows(us, heavy, rlqsL-60)
	})

	for _, w := range []time.Duration{time.Second, 5 * time.Second, 10 * time.Second} {
		bound := int64(rlqsL*w.Seconds()) + rlqsBurst + int64(rlqsL*(rlqsTTL+rlqsSlack+rlqsMaxFill).Seconds())
		got := l.maxWindow(w)
		t.Logf("window %v: at most %d admitted, bound L·W + B = %d (ideal L·W + b = %d)", w, got, bound, int64(rlqsL*w.Seconds())+rlqsBurst)
		if got > bound {
			t.Errorf("window %v: %d admitted, over the bound %d", w, got, bound)
		}
	}
}

func round(xs []float64) string {
	s := "["
	for i, x := range xs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%.0f", x)
	}
	return s + "]"
}

// strategies describes what each proxy holds: tokens per fill, or a
// blanket rule, or "-".
func strategies(ps []*envoyProxy) string {
	s := ""
	for _, p := range ps {
		p.mu.Lock()
		b := p.buckets[p.tenant]
		switch {
		case b == nil || b.expires.IsZero() || time.Now().After(b.expires):
			s += " -"
		case b.hasBlanket:
			s += " " + b.blanket.String()
		default:
			s += fmt.Sprintf(" %d/s", b.tb.GetTokensPerFill().GetValue())
		}
		p.mu.Unlock()
	}
	return s
}
