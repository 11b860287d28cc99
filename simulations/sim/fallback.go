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
// agents the region last reported × FallbackHeadroom, starting with one
// cost, with a capacity of max(τ, period/10) at that rate (at least one
// cost; lease/agent's emergency bucket). That is this fault's
// E_fault (DESIGN.md, "open or local fallback while a region is
// unreachable"): the region's bucket keeps its share of L·W + b, and on
// top of it, in windows that meet the outage,
//
//	local: Σ_agents headroom × L ÷ agents_a   per second in the outage,
//	       plus max(τ, period/10) of that rate and one cost per agent
//	       (the capacities, and the cost each starts with);
//	open:  unbounded (such windows are not checked);
//	closed: nothing.
//
// The regional rate of a grant is at most L, so the term takes L (for a
// fixed window L is its limit ÷ period, which the grants' rate is a share
// of, and a window counts the part of the outage within it). It lasts
// until every agent of the region has closed its breaker after the outage,
// plus a refresh timeout (a call sent before that fails at its deadline)
// and 2τ.

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
	o := openTerm{
		fault: fault, region: r.idx,
		over: func() bool { return !w.anyBreakerOpen(r) },
		tail: int64(w.sc.LeasePeriod) + 2*int64(w.sc.LeaseTTL),
	}
	for ki := range w.keys {
		k := &w.keys[ki]
		switch k.rule.OnError {
		case policy.OnErrorOpen:
			w.addTerm(&o, ki, faultSpan{from: t, to: math.MaxInt64, tokens: math.Inf(1)}, false)
		case policy.OnErrorClosed:
		default:
			rate := w.headroom() * k.rate * inv
			w.addTerm(&o, ki, faultSpan{from: t, to: math.MaxInt64, rate: rate,
				tokens: rate*w.emergencyBank(k) + float64(len(r.agents)*int(k.cost))}, true)
		}
	}
	w.terms = append(w.terms, o)
}

// emergencyBank is how long, at its rate, an agent's emergency bucket for
// key k banks: max(τ, period/10) seconds (lease/agent).
func (w *world) emergencyBank(k *simKey) float64 {
	return max(w.sc.LeaseTTL.Seconds(), k.rule.Period.Seconds()/10)
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
	for _, o := range w.terms {
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
			f.tokens += rate*w.emergencyBank(k) + float64(n*int(k.cost))
		}
	}
}

func (w *world) anyBreakerOpen(r *regiond) bool {
	for _, a := range r.agents {
		if a.d.Stats().BreakerOpen {
			return true
		}
	}
	return false
}
