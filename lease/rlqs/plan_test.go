package rlqs

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ration-dev/ration/policy"
)

var testSizing = sizing{ttl: 2 * time.Second, slack: 500 * time.Millisecond, fill: time.Second, headroom: 1.1, use: 0.95}

var t0 = time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func ruleOf(cost int64) *policy.Rule {
	return &policy.Rule{Name: "r", Limit: 1000, Period: time.Second, Burst: 1000, Cost: cost}
}

// TestSizingSteps walks one bucket through fixed instants: a fresh bucket
// pre-debits its capacity and refills until TTL + slack; keep-alives lease
// the next half second's refills; a keep-alive the region cannot pay
// shortens the TTL, then the bucket is refitted to what is left, then
// denied.
func TestSizingSteps(t *testing.T) {
	z := testSizing
	q := &quota{rule: ruleOf(1), rate: 100, regionRate: 1000}
	z.plan(q, at(0), 500*time.Millisecond, 100)
	// 110 per fill, capacity 55: 55 + 110 × 2.5 s.
	if !q.fresh || q.want != 55+275 {
		t.Fatalf("fresh plan: fresh %v want %d, want true 330", q.fresh, q.want)
	}
	a := z.settle(q, at(0), q.want)
	if a.kind != actBucket || a.strategy != (strategy{max: 55, perFill: 110}) || a.ttl != 2*time.Second {
		t.Fatalf("fresh: got %+v", a)
	}
	if !q.paidUntil.Equal(at(2500)) || q.bank != 0 {
		t.Fatalf("paid until %v, bank %d; want %v, 0", q.paidUntil, q.bank, at(2500))
	}
	// Keep-alive half a second later: 55 tokens to pay until 3 s.
	z.plan(q, at(500), 500*time.Millisecond, 100)
	if q.fresh || q.want != 55 {
		t.Fatalf("keep-alive plan: fresh %v want %d, want false 55", q.fresh, q.want)
	}
	if a := z.settle(q, at(500), 55); a.kind != actBucket || a.ttl != 2*time.Second || !q.paidUntil.Equal(at(3000)) {
		t.Fatalf("keep-alive: got %+v, paid until %v", a, q.paidUntil)
	}
	// The region grants nothing: paid until 3 s is 1.5 s past now + slack,
	// so a TTL of 1 s.
	z.plan(q, at(1000), 500*time.Millisecond, 100)
	if a := z.settle(q, at(1000), 0); a.kind != actBucket || a.ttl != time.Second {
		t.Fatalf("unpaid keep-alive: got %+v, want the same bucket for 1s", a)
	}
	z.plan(q, at(1500), 500*time.Millisecond, 100)
	if a := z.settle(q, at(1500), 0); a.kind != actBucket || a.ttl != time.Second {
		t.Fatalf("unpaid keep-alive: got %+v, want the same bucket for 1s", a)
	}
	// Again nothing: less than a second left; the bucket is refitted from
	// the refills past now + slack (0.5 s of 110), too few for a fresh
	// one's 2.5 fills and its capacity: 55 / 3 → 18 per fill.
	z.plan(q, at(2000), 500*time.Millisecond, 100)
	a = z.settle(q, at(2000), 0)
	if a.kind != actBucket || a.strategy != (strategy{max: 9, perFill: 18}) || q.bank != 1 {
		t.Fatalf("refit: got %+v", a)
	}
	// The bank is spent; nothing more comes: DENY_ALL.
	for ms := 2500; ms <= 7000; ms += 500 {
		z.plan(q, at(ms), 500*time.Millisecond, 100)
		a = z.settle(q, at(ms), 0)
	}
	if a.kind != actDeny || a.ttl != 2*time.Second {
		t.Fatalf("nothing granted: got %+v, want DENY_ALL for 2s", a)
	}
}

func TestDesiredSharesTheRegion(t *testing.T) {
	z := testSizing
	for _, tc := range []struct {
		rate, region, key float64
		want              strategy
	}{
		{100, 0, 100, strategy{55, 110}},    // no grant yet: the demand with headroom
		{100, 1000, 100, strategy{55, 110}}, // plenty
		{100, 50, 100, strategy{24, 48}},    // the region's refill, less 5%
		{100, 300, 400, strategy{36, 72}},   // a quarter of what buckets ask for: 0.95 × 300 / 4
		{0, 300, 400, strategy{1, 1}},       // idle: one token
		{0.2, 1000, 0.2, strategy{1, 1}},    // a trickle
		{100, 300, 200, strategy{55, 110}},  // the others leave room
		{1e6, 1e9, 1e6, strategy{550000, 1.1e6}},
	} {
		if got, _ := z.desired(tc.rate, tc.region, tc.key); got != tc.want {
			t.Errorf("desired(%v, %v, %v) = %+v, want %+v", tc.rate, tc.region, tc.key, got, tc.want)
		}
	}
}

// TestObserveRobustToCadence learns rates from reports every 5 s (Envoy's
// cadence), with time_elapsed truncated to 0 s or whole seconds, and from
// a report a moment after another.
func TestObserveRobustToCadence(t *testing.T) {
	q := &quota{sampled: at(0)}
	q.observe(usage{allowed: 1}, at(0)) // subscription: one request
	if q.rate != 1 {
		t.Fatalf("first request: rate %v, want 1", q.rate)
	}
	for i := 1; i <= 4; i++ {
		q.observe(usage{allowed: 400, denied: 100}, at(5000*i))             // time_elapsed read 0 s
		if math.Abs(q.rate-100) > 0.5 || math.Abs(q.allowedRate-80) > 0.5 { // the first sample holds the subscription's request
			t.Fatalf("report %d: rate %v allowed %v, want 100 80", i, q.rate, q.allowedRate)
		}
	}
	// A report 100 ms after the last: counted towards the next sample, not
	// a rate of its own.
	q.observe(usage{allowed: 10, elapsed: 0}, at(20100))
	if math.Abs(q.rate-100) > 0.5 {
		t.Fatalf("quick report: rate %v, want 100", q.rate)
	}
	q.observe(usage{allowed: 490, elapsed: 5 * time.Second}, at(25000))
	if math.Abs(q.rate-100) > 0.5 {
		t.Fatalf("after a quick report: rate %v, want 100", q.rate)
	}
	// Demand falls: the rate halves its distance each sample.
	q.observe(usage{}, at(30000))
	if math.Abs(q.rate-50) > 0.5 {
		t.Fatalf("idle report: rate %v, want 50", q.rate)
	}
	// tally tells the requests reported, not the learned rate, over the
	// time to the next report (as long as the last gap, 5 s): 1 + 2,000 +
	// 10 + 490 requests, 1 + 1,600 + 10 + 490 allowed.
	var d, a int64
	for i := range 10 {
		dd, aa := q.tally(500 * time.Millisecond)
		if aa > dd {
			t.Fatalf("tick %d: %d allowed told, more than %d requests", i, aa, dd)
		}
		d, a = d+dd, a+aa
	}
	if d != 2501 || a != 2101 {
		t.Fatalf("tallies over 5 s: %d demand, %d allowed; want 2501 and 2101", d, a)
	}
}

// TestPreDebitCoversSpend is the pre-debit's invariant, checked against a
// proxy that spends every token its assignment lets it, as fast as it
// can: at every instant, what the proxy may have spent is no more than the
// store granted. Grants are random (none, part or all of the ask), demand
// and the region's rate change, and each response reaches the proxy up to
// slack after it is sent.
func TestPreDebitCoversSpend(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	z := testSizing
	const tick = 500 * time.Millisecond
	for run := 0; run < 200; run++ {
		cost := int64(1 + rng.IntN(3))
		q := &quota{rule: ruleOf(cost), rate: float64(rng.IntN(500)), regionRate: float64(rng.IntN(1000))}
		var granted, spent float64 // store tokens
		var s strategy             // the proxy's
		var since, expires time.Time
		spend := func(until time.Time) {
			if s == (strategy{}) {
				return
			}
			from, to := since, until
			if to.After(expires) {
				to = expires
			}
			if to.After(from) {
				spent += float64(s.perFill) * to.Sub(from).Seconds() / z.fill.Seconds() * float64(cost)
			}
			since = until
		}
		for k := 0; k < 60; k++ {
			now := t0.Add(time.Duration(k) * tick)
			if rng.IntN(5) == 0 {
				q.rate = float64(rng.IntN(500))
			}
			if rng.IntN(5) == 0 {
				q.regionRate = float64(rng.IntN(1000))
			}
			z.plan(q, now, tick, q.rate+float64(rng.IntN(500)))
			var g int64
			switch rng.IntN(3) {
			case 1:
				g = rng.Int64N(q.want + 1)
			case 2:
				g = q.want
			}
			granted += float64(g)
			a := z.settle(q, now, g)
			arrive := now.Add(time.Duration(rng.Int64N(int64(z.slack))))
			spend(arrive)
			switch a.kind {
			case actBucket:
				if a.ttl < time.Second || a.ttl%time.Second != 0 {
					t.Fatalf("seed %d: TTL %v", seed, a.ttl)
				}
				if a.strategy != s || !arrive.Before(expires) {
					s = a.strategy // a fresh bucket, full
					spent += float64(s.max * cost)
				}
				expires = arrive.Add(a.ttl)
			default:
				s = strategy{}
			}
			since = arrive
			if spent > granted+1e-6 {
				t.Fatalf("seed %d run %d tick %d: the proxy may have spent %.1f, the store granted %.0f", seed, run, k, spent, granted)
			}
		}
		spend(t0.Add(time.Hour))
		if spent > granted+1e-6 {
			t.Fatalf("seed %d run %d: the proxy may spend %.1f in all, the store granted %.0f", seed, run, spent, granted)
		}
	}
}

// TestTallyTellsRequestsSeen drives one bucket's reports as Envoy sends
// them (every second, then every 5 s with a quick report after some,
// time_elapsed truncated to whole seconds, timers and arrivals jittered),
// with Poisson requests of 400/s that fall to 100/s, and ticks every
// 500 ms: the exchange is told every request reported and no more, about
// one report interval late, and a fallen demand at once rather than by
// halves.
func TestTallyTellsRequestsSeen(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	rate := func(ms int) float64 {
		if ms < 30_000 {
			return 400
		}
		return 100
	}
	// Report send times on the proxy's clock, in ms.
	var sends []int
	for s := 1000; s < 60_000; s += 1000 {
		sends = append(sends, s+rng.IntN(3)-1)
	}
	for s := 60_000; s < 120_000; s += 5000 {
		sends = append(sends, s+rng.IntN(3)-1)
		if s%10_000 == 0 {
			sends = append(sends, s+100)
		}
	}
	q := &quota{rule: ruleOf(1), sampled: at(0), reported: at(0)}
	var seen, told int64
	toldIn := map[int]int64{} // by second of the tick
	tick := 250 + rng.IntN(500)
	last := 0
	for _, s := range sends {
		arrive := s + rng.IntN(2)
		for ; tick < arrive; tick += 500 {
			d, a := q.tally(500 * time.Millisecond)
			if a > d || d < 0 {
				t.Fatalf("seed %d: tick %d ms: %d allowed told of %d requests", seed, tick, a, d)
			}
			told += d
			toldIn[tick/1000] += d
			if told > seen {
				t.Fatalf("seed %d: tick %d ms: told %d, more than the %d reported", seed, tick, told, seen)
			}
			// Behind by at most a report interval and a tick of demand.
			if lag := float64(seen - told); lag > rate(tick)*5.5+40 && tick > 62_000 || lag > 400*1.5+60 {
				t.Fatalf("seed %d: tick %d ms: %d reported not told", seed, tick, seen-told)
			}
		}
		var n int64
		for ms := last; ms < s; ms++ {
			n += poisson(rng, rate(ms)/1000)
		}
		seen += n
		el := time.Duration(s-last) * time.Millisecond
		q.observe(usage{allowed: n * 4 / 5, denied: n - n*4/5, elapsed: el.Truncate(time.Second)}, at(arrive))
		last = s
	}
	// Each 2 s after the fall are told about 200 (the second before holds
	// the last report of 400/s): four standard deviations of Poisson noise,
	// and a tick's share at either end, since a report that reaches the
	// server just after a tick, rather than just before, is told a tick
	// later.
	for s := 32; s < 58; s += 2 {
		if d := toldIn[s] + toldIn[s+1]; d < 90 || d > 310 {
			t.Fatalf("seed %d: seconds %d–%d told %d requests, want 200 ± 110", seed, s, s+2, d)
		}
	}
	// At a 5 s cadence, 5 s of ticks tell about 500.
	for s := 70; s < 115; s += 5 {
		var d int64
		for i := range 5 {
			d += toldIn[s+i]
		}
		if d < 400 || d > 600 {
			t.Fatalf("seed %d: seconds %d–%d told %d requests, want 500 ± 100", seed, s, s+5, d)
		}
	}
}

// poisson draws a Poisson count of mean m (small).
func poisson(rng *rand.Rand, m float64) int64 {
	l, k, p := math.Exp(-m), int64(0), rng.Float64()
	for p > l {
		k++
		p *= rng.Float64()
	}
	return k
}
