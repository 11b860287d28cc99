package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
)

// fault starts fault i at t.
func (w *world) fault(i int, t int64) {
	f := &w.sc.Faults[i]
	r := w.rs[w.sc.regionIndex(f.Region)]
	switch f.Kind {
	case "partition":
		r.partitioned++
		w.ev.push(event{at: t + int64(f.For), kind: evHeal, fault: i})
	case "redis_failover":
		w.failover(r, f, t)
	case "crash_agents":
		if w.alg == Ideal {
			return
		}
		n := int(math.Round(f.Fraction * float64(len(r.agents))))
		for ; n > 0 && len(r.agents) > 0; n-- {
			// Drawn for the fault, not from w.net, as reports are
			// (reportDraw): which agents crash does not depend on the
			// agents' traffic before.
			j := int(faultDraw(w.sc.Seed, uint64(i), uint64(n)) % uint64(len(r.agents)))
			a := r.agents[j]
			a.alive = false
			w.dead = append(w.dead, a.d.Stats())
			r.agents = append(r.agents[:j], r.agents[j+1:]...)
		}
		if f.For > 0 {
			w.ev.push(event{at: t + int64(f.For), kind: evHeal, fault: i})
		}
	case "add_agents":
		w.addAgents(r, f.Agents)
	case "crash_proxies", "disconnect_proxies":
		w.proxyFault(i, r, t)
	case "unreachable":
		w.proxyFault(i, r, t)
		r.unreachable++
		w.fallbackStart(i, r, t)
		w.ev.push(event{at: t + int64(f.For), kind: evHeal, fault: i})
	case "policy_mismatch":
		r.base = w.mismatched[i]
		w.policyChanged(r)
		w.ev.push(event{at: t + int64(f.For), kind: evHeal, fault: i})
	case "restart":
		// The regiond process dies: its agents cannot reach it, and its
		// exchange stops (no epochs, no reports in or out).
		w.proxyFault(i, r, t)
		r.unreachable++
		r.down++
		w.fallbackStart(i, r, t)
		w.ev.push(event{at: t + int64(f.For), kind: evHeal, fault: i})
	}
}

// heal ends fault i at t: a partition lifts, crashed agents come back
// (new processes: cold, with nothing leased).
func (w *world) heal(i int, t int64) {
	f := &w.sc.Faults[i]
	r := w.rs[w.sc.regionIndex(f.Region)]
	switch f.Kind {
	case "partition":
		r.partitioned--
	case "crash_agents":
		n := int(math.Round(f.Fraction * float64(w.sc.AgentsPerRegion)))
		w.addAgents(r, n)
	case "crash_proxies", "disconnect_proxies":
		w.proxyHeal(i, r, t)
	case "unreachable":
		r.unreachable--
		w.proxyHeal(i, r, t)
		w.healTerms(i)
	case "policy_mismatch":
		r.base = w.set
		w.policyChanged(r)
	case "restart":
		r.unreachable--
		r.down--
		w.healTerms(i)
		if r.down == 0 {
			w.restart(r)
		}
		w.proxyHeal(i, r, t)
	}
}

func (w *world) addAgents(r *regiond, n int) {
	if w.alg == Ideal {
		return
	}
	w.fallbackAgents(r, n)
	for ; n > 0; n-- {
		if err := w.addAgent(r); err != nil {
			w.fail(err)
			return
		}
	}
}

// failover models a Redis failover in region r that loses the writes of the
// last LostWrites: the store falls back to the copy taken then, buckets and
// applied shares alike. The regiond's exchange state lives in its memory
// and is not touched. The excess it allows is counted in the bound: each
// key's bucket may hold up to b × its share again (DESIGN.md, "E_fault"),
// and a share the lost writes had lowered runs at its old rate until the
// regiond's next decision rewrites it.
func (w *world) failover(r *regiond, f *Fault, t int64) {
	if w.alg == Ideal {
		return // the ideal bucket is global and never fails
	}
	snap := r.snap
	if snap == nil {
		return
	}
	// A share the lost writes had lowered (a gift) comes back raised, and
	// the bucket refills at that rate until the region's next decision
	// writes every share again (the store's incarnation changed), at most a
	// sync period later.
	back := t + int64(w.sc.SyncPeriod) + int64(w.sc.SyncPeriod)/4 + 2*int64(w.sc.Network.ClockSkew) + 2*int64(w.sc.LeaseTTL)
	for ki := range w.keys {
		k := &w.keys[ki]
		cur, old := w.share(r, r.store, k.storeKey), w.share(r, snap, k.storeKey)
		s := max(cur, old)
		excess := k.burst * float64(s) / region.PPM
		if k.rule.FixedWindow() {
			w.windowFailover(ki, t, f.LostWrites, back, excess, old-cur)
			continue
		}
		w.m.addFault(ki, t-int64(f.LostWrites), t+w.refillSpan(k, s), excess)
		if old > cur {
			km := &w.m.keys[ki]
			km.faults = append(km.faults, faultSpan{from: t, to: back, rate: k.rate * float64(old-cur) / region.PPM})
		}
	}
	r.store.Restore(snap)
	r.snap = nil
}

// windowFailover adds a failover's E_fault for fixed-window key ki: the
// restored bucket holds up to limit × s_r again (excess), spendable only
// in the window the store is in, since leases end with it; and where the
// lost writes had lowered the share (by lowered ppm), a window the region
// enters before its next decision rewrites it (back) fills at the
// restored share, limit × the difference more.
func (w *world) windowFailover(ki int, t int64, lostWrites time.Duration, back int64, excess float64, lowered int64) {
	w.m.addFault(ki, t-int64(lostWrites), t+2*int64(w.sc.LeaseTTL), excess)
	if lowered > 0 {
		w.m.addFault(ki, t, back, w.keys[ki].burst*float64(lowered)/region.PPM)
	}
}

// refillSpan is how long tokens a failover gave back can stay in a
// bucket before it would have been full anyway, plus the leases they may
// sit in: capacity ÷ rate + 2τ.
func (w *world) refillSpan(k *simKey, sharePPM int64) int64 {
	span := k.burst / k.rate
	if sharePPM > 0 {
		span = max(span, float64(k.cost)/(k.rate*float64(sharePPM)/region.PPM))
	}
	return int64(span*float64(time.Second)) + 2*int64(w.sc.LeaseTTL)
}

// ratesAt sets w.rates to each region's request rate at t.
func (w *world) ratesAt(t int64) {
	ds := w.sc.Demand
	for w.demandAt+1 < len(ds) && int64(ds[w.demandAt+1].At) <= t {
		w.demandAt++
	}
	cur := &ds[w.demandAt]
	rates := cur.Rates
	if cur.Every > 0 && ((t-int64(cur.At))/int64(cur.Every))%2 == 1 {
		rates = cur.AltRates
	}
	for i, name := range w.sc.Regions {
		x := rates[name]
		if cur.Ramp > 0 && w.demandAt > 0 && t < int64(cur.At+cur.Ramp) {
			prev := ds[w.demandAt-1].Rates[name]
			frac := float64(t-int64(cur.At)) / float64(cur.Ramp)
			x = prev + (x-prev)*frac
		}
		w.rates[i] = x
	}
}

// restart brings region r's regiond back as a new process: a new exchange
// that takes over from the state it last persisted (after Commit, before
// publishing, as the exchanger does) and learns the store's incarnation
// afresh.
func (w *world) restart(r *regiond) {
	if w.alg != Escrow {
		return
	}
	if err := w.newNode(r); err != nil {
		w.fail(fmt.Errorf("sim: restarting: %w", err))
	}
	r.enforced = nil // the new process has heard no peer: it enforces its own policy
	w.enforce(r)
}

// policyChanged is region r loading another policy (r.base).
func (w *world) policyChanged(r *regiond) {
	if w.alg != Escrow {
		return
	}
	r.node.PolicyChanged()
	r.enforced = nil
	w.enforce(r)
}

// mismatch builds, for each policy_mismatch fault, the scenario's policy
// with every rule's limit and burst multiplied by the fault's factor.
func (w *world) mismatch() error {
	for i, f := range w.sc.Faults {
		if f.Kind != "policy_mismatch" {
			continue
		}
		var rules []*policy.Rule
		for _, r := range w.set.Rules() {
			c := *r
			c.Limit = max(1, int64(math.Round(float64(r.Limit)*f.Factor)))
			c.Burst = max(c.Cost, int64(math.Round(float64(r.Burst)*f.Factor)))
			if c.FixedWindow() {
				c.Burst = c.Limit
			}
			c.Cost = min(c.Cost, c.Burst)
			rules = append(rules, &c)
		}
		set, err := policy.Derive(fmt.Sprintf("%s (policy_mismatch ×%g)", w.sc.Name, f.Factor), rules)
		if err != nil {
			return fmt.Errorf("sim: faults[%d]: %w", i, err)
		}
		if w.mismatched == nil {
			w.mismatched = map[int]*policy.Set{}
		}
		w.mismatched[i] = set
	}
	return nil
}
