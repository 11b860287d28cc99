package regiond

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/cutproxy"
	"github.com/ration-dev/ration/internal/redistest"
	leasev1 "github.com/ration-dev/ration/lease/v1"
)

// TestSentinelFailoverUnderLoad is issue 18's Sentinel test. eu's regiond
// runs on a Redis under Sentinel (a primary, a replica, three sentinels,
// -redis redis-sentinel://…), us's on its own redis-server; both exchange
// over NATS while demand for one key (1,000 tokens/s, burst 2,000) is
// half again its limit. eu's primary is killed (SIGKILL) after its
// replica was cut off from it, so the replica lacks the last writes, as
// after asynchronous replication's lag; Sentinel promotes the replica and
// eu's regiond follows it without a restart:
//
//   - eu's leases fail (Unavailable) only until the promotion and succeed
//     again within recoverBound of the kill; eu is ready again;
//   - the store's incarnation changes from the primary's run_id to the
//     replica's (run_id belongs to the process and is not replicated, so
//     every promotion changes it, whatever asynchronous replication lost),
//     and eu's exchange sees that (SawStore) and writes every share again
//     (ration_exchange_store_resyncs_total 1);
//   - the exchange then moves the share with demand as before, the shares
//     never sum above 1, and the tokens admitted by both regions over the
//     whole run stay within one ideal bucket's L·W + B.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	const (
		limit, burst = 1000.0, 2000.0 // the example policy's per-tenant rule
		recoverBound = 10 * time.Second
		lostBytes    = 2048 // of replication stream: a few dozen lease scripts and exchange writes
	)
	regions := []string{"eu", "us"}
	st := redistest.StartSentinel(t)
	us := redistest.StartServer(t)
	nats := strings.TrimPrefix(startNATS(t), "nats://")
	dep := &deployment{t: t, regions: regions, nodes: map[string][]*Daemon{}, proxies: map[string]*cutproxy.Proxy{},
		redis:   map[string]string{"eu": st.URL(), "us": us.URL()},
		servers: map[string]*redistest.Server{"eu": st.Primary, "us": us}}
	for _, r := range regions {
		dep.proxies[r] = cutproxy.Start(t, nats)
		dep.add(r, r+"-0")
	}
	eu := dep.nodes["eu"][0]
	incarnation := func() string {
		t.Helper()
		inc, err := eu.redis.Incarnation(context.Background())
		if err != nil {
			t.Fatalf("eu's store incarnation: %v", err)
		}
		return inc
	}
	if got, want := incarnation(), redistest.RunID(t, st.Primary); got != want {
		t.Fatalf("eu's incarnation %q, want the primary's run_id %q", got, want)
	}
	replica := redistest.RunID(t, st.Replica)

	start := time.Now()
	rates := map[string]int64{"eu": 1200, "us": 300}
	l := dep.load(map[string]int64{"us": rates["us"]})
	euLoad := startProbe(t, client(t, eu), rates["eu"])
	want := targets(regions, rates)
	dep.observe("eu takes its share", 10*time.Second, func(sh map[string]int64) bool { return within5(sh, want, regions...) })

	// Lose writes as asynchronous replication does: cut the replica off
	// while eu keeps writing to the primary, then kill the primary.
	st.CutReplication(t)
	cutAt := redistest.ReplOffset(t, st.Primary)
	waitFor(t, func() bool { return redistest.ReplOffset(t, st.Primary) > cutAt+lostBytes })
	last := redistest.ReplOffset(t, st.Primary)
	st.Primary.Stop()
	killed := time.Now()
	lost := last - redistest.ReplOffset(t, st.Replica)
	t.Logf("the replica missed at least %d bytes of the primary's replication stream", lost)
	if lost < lostBytes {
		t.Fatalf("the replica missed %d bytes of the stream, want at least %d", lost, lostBytes)
	}
	promoted := st.WaitPromoted(t, 15*time.Second)
	// Recovered: leases succeed after the kill, and none has failed for a
	// second since the first of those successes.
	var back time.Duration
	var failed int
	deadline := killed.Add(recoverBound + 5*time.Second)
	for {
		recovered, n := euLoad.recovered(killed)
		if !recovered.IsZero() && time.Since(recovered) > time.Second {
			back, failed = recovered.Sub(killed), n
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("eu's leases still failing %v after the primary was killed (%d failures)", time.Since(killed), n)
		}
		time.Sleep(20 * time.Millisecond) // sampling interval, not a wait for an event
	}
	t.Logf("primary killed: sentinels promoted the replica after %v; eu's leases failed %d times and succeed again since %v after the kill", promoted, failed, back)
	if back > recoverBound {
		t.Errorf("eu's leases recovered %v after the kill, want within %v", back, recoverBound)
	}
	// A lost write may have been a lowered share, which would bring back
	// share eu gave away until its exchange resyncs: bounded, as after a
	// Redis restart without persistence.
	dep.overPPM(t, "the failover", 4*syncPeriod)
	if got := incarnation(); got != replica {
		t.Errorf("eu's incarnation after the failover %q, want the replica's run_id %q", got, replica)
	}
	waitFor(t, func() bool { code, _ := get(t, "http://"+eu.AdminAddr()+"/readyz"); return code == 200 })
	admin := "http://" + eu.AdminAddr() + "/metrics"
	resyncs := regexp.MustCompile(`(?m)^ration_exchange_store_resyncs_total (\d+)$`)
	waitFor(t, func() bool {
		_, body := get(t, admin)
		m := resyncs.FindStringSubmatch(body)
		return m != nil && m[1] != "0"
	})
	if _, body := get(t, admin); !strings.Contains(body, "ration_exchange_store_resyncs_total 1\n") {
		t.Errorf("eu's /metrics: want ration_exchange_store_resyncs_total 1 after one promotion:\n%s", resyncs.FindString(body))
	}

	// The exchange, on the new master, follows demand as before.
	rates = map[string]int64{"eu": 300, "us": 1200}
	l.set(map[string]int64{"us": rates["us"]})
	euLoad.setRate(rates["eu"])
	want = targets(regions, rates)
	_, took := dep.observe("us takes the share after the failover", 15*time.Second, func(sh map[string]int64) bool {
		return within5(sh, want, regions...)
	})
	t.Logf("after the failover the shares reached their new targets in %v", took)

	euLoad.stop()
	window := time.Since(start)
	euGranted, oks, fails := euLoad.totals()
	t.Logf("eu's lease calls (one at a time): %d succeeded, %d failed, the slowest failure after %v", oks, fails, euLoad.slowest)
	admitted := euGranted + l.granted["us"].Load()
	allowance := limit*window.Seconds() + burst
	ratio := float64(admitted) / allowance
	t.Logf("admitted %d tokens (eu %d, us %d) in %v; L·W + B = %.0f; ratio %.3f", admitted, euGranted, l.granted["us"].Load(), window.Round(time.Millisecond), allowance, ratio)
	if ratio > 1 {
		t.Errorf("admitted %d tokens in %v, more than one bucket's L·W + B = %.0f (ratio %.3f)", admitted, window, allowance, ratio)
	}
}

// probe leases tokens of the per-tenant key for tenant acme at a rate,
// in 10ms steps, counting what is granted and when calls fail.
type probe struct {
	mu      sync.Mutex
	rate    int64
	granted int64
	fails   []time.Time   // when each failed call returned
	oks     []time.Time   // when each successful call returned
	slowest time.Duration // of the failed calls
	done    chan struct{}
	wg      sync.WaitGroup
}

func startProbe(t *testing.T, c leasev1.LeaseServiceClient, rate int64) *probe {
	p := &probe{rate: rate, done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		rate := func() int64 { p.mu.Lock(); defer p.mu.Unlock(); return p.rate }
		pace(p.done, rate, func(n int64) bool {
			sent := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := c.Lease(ctx, &leasev1.LeaseRequest{
				Agent: &leasev1.Agent{Id: "probe"},
				Items: []*leasev1.LeaseItem{{Rule: "per-tenant", Key: "tenant=acme", Want: n, Demand: n}},
			})
			cancel()
			at := time.Now()
			p.mu.Lock()
			defer p.mu.Unlock()
			if err != nil {
				if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
					t.Errorf("lease: got %v, want Unavailable while the store fails over", err)
				}
				p.fails = append(p.fails, at)
				p.slowest = max(p.slowest, at.Sub(sent))
				return false
			}
			p.oks = append(p.oks, at)
			for _, g := range resp.GetGrants() {
				p.granted += g.GetGranted()
			}
			return true
		})
	}()
	t.Cleanup(p.stop)
	return p
}

func (p *probe) setRate(rate int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rate = rate
}

// recovered reports when the first successful call after t's last failed
// one returned (zero if none yet), and how many calls failed after t.
func (p *probe) recovered(t time.Time) (at time.Time, failed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lastFail := t
	for _, f := range p.fails {
		if f.After(t) {
			lastFail = f
			failed++
		}
	}
	for _, ok := range p.oks {
		if ok.After(lastFail) {
			return ok, failed
		}
	}
	return time.Time{}, failed
}

func (p *probe) totals() (granted int64, oks, fails int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.granted, len(p.oks), len(p.fails)
}

// stop ends the probe and waits for it; stopping twice is harmless.
func (p *probe) stop() {
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	p.wg.Wait()
}
