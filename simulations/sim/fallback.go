package sim

import (
	"math"

	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/policy"
)

// While a region's agents cannot reach their regiond, each key decides by
// its rule's on_error (lease/agent): closed denies, open admits everything,
// local spends the leases held and then an emergency bucket per agent at
// the regional rate of its last grant (the rule's rate L before any) ÷ the
// agents the region last reported × FallbackHeadroom, starting empty, with
// a capacity of τ at that rate (at least one cost). That is this fault's
// E_fault (DESIGN.md, "open or local fallback while a region is
// unreachable"): the region's bucket keeps its share of L·W + b, and on
// top of it, in windows that meet the outage,
//
//	local: Σ_agents headroom × L ÷ agents_a   per second in the outage,
//	       plus τ of that rate and one cost per agent (the capacities);
//	open:  unbounded (such windows are not checked);
//	closed: nothing.
//
// The regional rate of a grant is at most L, so the term takes L. It lasts
// until every agent of the region has closed its breaker after the outage,
// plus a refresh timeout (a call sent before that fails at its deadline)
// and 2τ.

// openFallback is the excess terms of an unreachable regiond, open until
// the outage has ended and the region's agents reach it again.
type openFallback struct {
	fault, region int
	spans         []fallbackSpan
	healed        bool
}

type fallbackSpan struct {
	key, span int
	local     bool
}

// fallbackStart adds, for each key whose rule fails open or local, the
// excess the agents of region r may admit while unreachable from t on.
func (w *world) fallbackStart(fault int, r *regiond, t int64) {
	if w.alg == Ideal {
		return
	}
	var inv float64 // Σ over the agents of 1 ÷ the agents they know of
	for _, a := range r.agents {
		inv += 1 / float64(max(a.d.Stats().Agents, 1))
	}
	o := openFallback{fault: fault, region: r.idx}
	for ki := range w.keys {
		k := &w.keys[ki]
		var f faultSpan
		switch k.rule.OnError {
		case policy.OnErrorOpen:
			f = faultSpan{from: t, to: math.MaxInt64, tokens: math.Inf(1)}
		case policy.OnErrorClosed:
			continue
		default:
			rate := w.headroom() * k.rate * inv
			f = faultSpan{from: t, to: math.MaxInt64, rate: rate,
				tokens: rate*w.sc.LeaseTTL.Seconds() + float64(len(r.agents)*int(k.cost))}
		}
		km := &w.m.keys[ki]
		km.faults = append(km.faults, f)
		o.spans = append(o.spans, fallbackSpan{key: ki, span: len(km.faults) - 1, local: f.rate > 0})
	}
	w.fallbacks = append(w.fallbacks, o)
}

func (w *world) headroom() float64 {
	if h := w.agCfg.FallbackHeadroom; h > 0 {
		return h
	}
	return agent.DefaultFallbackHeadroom
}

// fallbackAgents widens the open local terms of region r for n agents that
// start while it is unreachable: they know of no other agent yet.
func (w *world) fallbackAgents(r *regiond, n int) {
	for _, o := range w.fallbacks {
		if o.region != r.idx {
			continue
		}
		for _, s := range o.spans {
			if !s.local {
				continue
			}
			k := &w.keys[s.key]
			f := &w.m.keys[s.key].faults[s.span]
			rate := w.headroom() * k.rate * float64(n)
			f.rate += rate
			f.tokens += rate*w.sc.LeaseTTL.Seconds() + float64(n*int(k.cost))
		}
	}
}

// fallbackHeal notes that the outage of fault has ended.
func (w *world) fallbackHeal(fault int) {
	for i := range w.fallbacks {
		if w.fallbacks[i].fault == fault {
			w.fallbacks[i].healed = true
		}
	}
}

// checkFallbacks closes, at t, the terms of ended outages whose region's
// agents all reach it again.
func (w *world) checkFallbacks(t int64) {
	out := w.fallbacks[:0]
	for _, o := range w.fallbacks {
		if o.healed && !w.anyBreakerOpen(w.rs[o.region]) {
			end := t + int64(w.sc.LeasePeriod) + 2*int64(w.sc.LeaseTTL)
			for _, s := range o.spans {
				w.m.keys[s.key].faults[s.span].to = end
			}
			continue
		}
		out = append(out, o)
	}
	w.fallbacks = out
}

func (w *world) anyBreakerOpen(r *regiond) bool {
	for _, a := range r.agents {
		if a.d.Stats().BreakerOpen {
			return true
		}
	}
	return false
}
