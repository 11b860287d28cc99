package sim

import (
	"time"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/region"
)

// Every run also asks, for every request, one ideal bucket per key (rate L,
// capacity b, full at the start, no latency), and counts what it would
// have admitted. Admitted ÷ that is the run's utilisation against the ideal
// fed the very same requests at the same instants: the ideal algorithm's
// own run draws other arrivals (its random stream skips the agents' picks),
// and the per-second utilisation clips each second at L, which hides the
// tokens a bucket holds, almost all of a quota with a long period.

// versus counts, per demand step, what the run and the ideal buckets
// admitted.
type versus struct {
	// ideal holds the ideal buckets: a lease.MemoryStore, whose grants of
	// one cost at a time are the ideal bucket's, for a fixed window too.
	ideal         *lease.MemoryStore
	req           []lease.GrantRequest // per key
	out           []lease.Grant
	admitted      []int64 // per demand step
	idealAdmitted []int64
}

func newVersus(keys, steps int) versus {
	return versus{
		ideal: lease.NewMemoryStore(lease.MemoryConfig{Shards: 1}), req: make([]lease.GrantRequest, keys), out: make([]lease.Grant, 1),
		admitted: make([]int64, steps), idealAdmitted: make([]int64, steps),
	}
}

// idealAsked offers a request of key ki to its ideal bucket at t (ns).
func (m *meter) idealAsked(ki int, t int64) {
	at := m.w.base.Add(time.Duration(t))
	m.w.idealRequest(&m.vs.req[ki], ki, at)
	m.vs.ideal.GrantAt(at, m.vs.req[ki:ki+1], m.vs.out)
	if m.vs.out[0].Granted > 0 {
		m.vs.idealAdmitted[m.w.demandAt] += m.vs.out[0].Granted
	}
}

// idealRequest sets r to one cost of key ki from the key's one ideal bucket
// (the whole quota in one region) at time at.
func (w *world) idealRequest(r *lease.GrantRequest, ki int, at time.Time) {
	k := &w.keys[ki]
	if r.Key == "" || k.rule.FixedWindow() {
		// A fixed window's boundaries move with time.
		*r = lease.GrantRequest{Key: k.storeKey, Want: k.cost, Limit: service.Limit(k.rule, region.PPM, at)}
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
