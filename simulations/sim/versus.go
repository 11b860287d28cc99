package sim

import "math"

// Every run also asks, for every request, one ideal bucket per key (rate L,
// capacity b, full at the start, no latency), and counts what it would
// have admitted. Admitted ÷ that is the run's utilisation against the ideal
// fed the very same requests at the same instants: the ideal algorithm's
// own run draws other arrivals (its random stream skips the agents' picks),
// and the per-second utilisation clips each second at L, which hides the
// tokens a bucket holds, almost all of a quota with a long period.

// idealBucket is one key's ideal bucket, with lease.MemoryStore's
// arithmetic (lease/bucket.go), so that in the ideal algorithm's run it
// admits exactly what the store does (TestVersusIdealMatchesTheStore).
type idealBucket struct {
	tokens float64
	last   int64 // µs of simulated time
	used   bool
}

// take refills b to nowUS at rate, up to capacity, and debits one cost if
// it holds one. A bucket the store would have let expire is full again by
// then, so expiry changes nothing here.
func (b *idealBucket) take(nowUS int64, rate, capacity float64, cost int64) bool {
	if !b.used {
		b.tokens, b.last, b.used = capacity, nowUS, true
	}
	if nowUS > b.last {
		elapsed := float64(nowUS-b.last) / 1e6
		t := b.tokens + float64(elapsed*rate)
		b.tokens = min(t, capacity)
		b.last = nowUS
	}
	c := float64(cost)
	n := math.Floor(b.tokens / c)
	if n*c > b.tokens {
		n--
	}
	if n < 1 {
		return false
	}
	b.tokens -= c
	return true
}

// versus counts, per demand step, what the run and the ideal buckets
// admitted.
type versus struct {
	buckets       []idealBucket // per key
	admitted      []int64       // per demand step
	idealAdmitted []int64
}

func newVersus(keys, steps int) versus {
	return versus{buckets: make([]idealBucket, keys), admitted: make([]int64, steps), idealAdmitted: make([]int64, steps)}
}

// idealAsked offers a request of key ki to its ideal bucket at t (ns).
func (m *meter) idealAsked(ki int, t int64) {
	k := &m.w.keys[ki]
	if m.vs.buckets[ki].take(t/1000, k.rate, k.burst, k.cost) {
		m.vs.idealAdmitted[m.w.demandAt] += k.cost
	}
}

// StepSummary is one demand step of a run.
type StepSummary struct {
	// AtS is when the step starts, in seconds.
	AtS float64 `json:"at_s"`
	// Admitted and IdealAdmitted are the tokens the run and the ideal
	// buckets admitted from the step's start to the next step's;
	// VersusIdealPct is their ratio in percent (null when the ideal
	// admitted nothing).
	Admitted       int64    `json:"admitted"`
	IdealAdmitted  int64    `json:"ideal_admitted"`
	VersusIdealPct *float64 `json:"admitted_vs_ideal_pct"`
	// ConvergenceS is, for escrow and a step whose convergence is measured
	// (as Summary.ConvergenceS: it does not alternate and its ramp ends
	// before the next step), the time from the end of its ramp until every
	// region's share of the first key was within ±5% of its target; the
	// step's whole length, and Unconverged, when it never was. Null
	// otherwise.
	ConvergenceS *float64 `json:"convergence_s"`
	Unconverged  bool     `json:"unconverged,omitempty"`
}

// steps summarises the demand steps.
func (w *world) steps() []StepSummary {
	m := w.m
	out := make([]StepSummary, len(w.sc.Demand))
	for i, d := range w.sc.Demand {
		out[i] = StepSummary{AtS: d.At.Seconds(), Admitted: m.vs.admitted[i], IdealAdmitted: m.vs.idealAdmitted[i],
			VersusIdealPct: ratioPct(m.vs.admitted[i], m.vs.idealAdmitted[i])}
	}
	for _, p := range m.phases {
		took := p.took
		if !p.done {
			took = p.end - p.start
			out[p.step].Unconverged = true
		}
		s := round3(float64(took) / 1e9)
		out[p.step].ConvergenceS = &s
	}
	return out
}

// ratioPct is a ÷ b in percent, rounded as the summary's fields; nil when
// b is 0.
func ratioPct(a, b int64) *float64 {
	if b == 0 {
		return nil
	}
	x := round4(float64(a) / float64(b) * 100)
	return &x
}
