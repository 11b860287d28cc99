package sim

import (
	"fmt"
	"time"

	"github.com/ration-dev/ration/lease/agent"
)

// Options tune one run.
type Options struct {
	// Algorithm defaults to Escrow.
	Algorithm Algorithm
	// Progress, when set, is called with the simulated time done, about
	// every 1% of the run and at its end.
	Progress func(done, total time.Duration)
}

// Result is what a run measured.
type Result struct {
	Summary Summary
	// Series is the time series, one row per Scenario.Sample.
	Series []Sample
	// Regions are the regions' names, as the series' columns index them.
	Regions []string

	limit float64 // Σ L over the keys, for plots
}

// Run simulates sc with one algorithm. The Summary's WallSeconds is the
// only field that depends on anything but sc and its seed.
func Run(sc *Scenario, opt Options) (*Result, error) {
	if opt.Algorithm == "" {
		opt.Algorithm = Escrow
	}
	switch opt.Algorithm {
	case Escrow, Static, Ideal:
	default:
		return nil, fmt.Errorf("sim: unknown algorithm %q (want escrow, static or ideal)", opt.Algorithm)
	}
	start := time.Now()
	w, err := newWorld(sc, opt.Algorithm)
	if err != nil {
		return nil, err
	}
	w.loop(opt.Progress)
	if w.firstErr != nil {
		return nil, w.firstErr
	}
	res := w.result()
	res.Summary.WallSeconds = round3(time.Since(start).Seconds())
	return res, nil
}

// loop runs the clock: at each step, the events due, then the step's
// arrivals, then the agents' refreshers.
func (w *world) loop(progress func(done, total time.Duration)) {
	sc := w.sc
	step, end := int64(sc.Step), int64(sc.Duration)
	grid, sample := int64(w.m.grid), int64(w.m.sample)
	const checkEvery = int64(100 * time.Millisecond)
	if w.alg == Escrow {
		for _, r := range w.rs {
			first := int64(sc.SyncPeriod) - r.skew
			for first <= 0 {
				first += int64(sc.SyncPeriod)
			}
			w.ev.push(event{at: first, kind: evEpoch, region: r.idx})
		}
	}
	for i, f := range sc.Faults {
		if f.Kind == "redis_failover" {
			w.ev.push(event{at: max(int64(f.At-f.LostWrites), 0), kind: evClone, region: sc.regionIndex(f.Region), fault: i})
		}
		w.ev.push(event{at: int64(f.At), kind: evFault, fault: i})
	}
	nextProgress := int64(0)
	for t := int64(0); t < end; t += step {
		w.events(t, false) // what happened before t belongs to the bins before t
		if t > 0 && t%grid == 0 {
			w.m.closeBin(t)
		}
		if t > 0 && t%int64(time.Second) == 0 {
			w.m.closeSecond()
		}
		if t > 0 && t%sample == 0 {
			w.m.closeSample(t)
		}
		w.events(t, true)
		if t%checkEvery == 0 {
			if w.alg == Escrow {
				w.m.checkConvergence(t)
			}
			w.checkTerms(t)
			w.proxyCheck(t)
		}
		w.arrivals(t)
		w.pollAgents(t)
		if progress != nil && t >= nextProgress {
			progress(dur(t), sc.Duration)
			nextProgress = t + end/100
		}
		if w.firstErr != nil {
			return
		}
	}
	w.events(end, false)
	w.m.closeBin(end)
	w.m.closeWindows()
	if end%int64(time.Second) == 0 {
		w.m.closeSecond()
	}
	w.m.closeSample(end)
	if progress != nil {
		progress(sc.Duration, sc.Duration)
	}
}

// events handles the events due before t (or at t too, when inclusive).
func (w *world) events(t int64, inclusive bool) {
	for {
		at, ok := w.ev.next()
		if !ok || at > t || (at == t && !inclusive) {
			return
		}
		e := w.ev.pop()
		w.now = e.at
		w.handle(&e)
	}
}

func (w *world) handle(e *event) {
	switch e.kind {
	case evExec:
		w.exec(e)
	case evDone:
		if a := e.ag; a.alive {
			a.d.Complete(dur(e.at), e.call, e.resp, e.err)
			w.resolved(a, e.at)
			w.poll(a, e.at)
		}
	case evEpoch:
		w.epoch(w.rs[e.region], e.at)
	case evDecide:
		w.decide(w.rs[e.region], e.at)
	case evReport:
		w.deliver(e)
	case evFault:
		w.fault(e.fault, e.at)
	case evHeal:
		w.heal(e.fault, e.at)
	case evClone:
		w.rs[e.region].snap = w.rs[e.region].store.Clone()
	case evProxy:
		w.proxyEvent(e.px)
	case evDry:
		if a := e.ag; a.alive && a.r.unreachable == 0 {
			if retry := a.r.svc.DryRetry(*e.dry); retry > 0 {
				a.d.Dry(dur(e.at), e.dry.Rule.Name, e.dry.Key, retry)
			}
		}
	}
}

// arrivals draws the step's requests of every region and decides each.
// The regions' requests are interleaved one by one, so that no region is
// always first at a bucket they share (the ideal algorithm's).
func (w *world) arrivals(t int64) {
	w.ratesAt(t)
	stepS := w.sc.Step.Seconds()
	now := dur(t)
	left := 0
	for ri := range w.rs {
		w.counts[ri] = w.poisson[ri].draw(w.arr, w.rates[ri]*stepS)
		left += w.counts[ri]
	}
	for left > 0 {
		for ri, r := range w.rs {
			if w.counts[ri] == 0 {
				continue
			}
			w.counts[ri]--
			left--
			w.request(r, ri, now)
		}
	}
}

// request draws one request's key and agent in region r and decides it.
func (w *world) request(r *regiond, ri int, now time.Duration) {
	ki := w.pick.draw(w.arr)
	k := &w.keys[ki]
	w.m.asked(ki, ri, k.cost)
	w.m.idealAsked(ki, int64(now))
	if w.alg == Ideal {
		w.idealOps++
		w.idealRequest(&w.idealReq[ki], ki, w.base.Add(now))
		w.ideal.GrantAt(w.base.Add(now), w.idealReq[ki:ki+1], w.idealOut)
		if w.idealOut[0].Granted > 0 {
			w.m.admitted(ki, ri, k.cost, int64(now))
		}
		return
	}
	if r.proxied() {
		w.proxyRequest(r, ri, ki, now)
		return
	}
	if len(r.agents) == 0 {
		return // no agent to ask: the request goes nowhere
	}
	a := r.agents[w.arr.IntN(len(r.agents))]
	if d, ok := a.d.Decide(now, k.ds, 1, uint64(ki)); ok && d.Allowed {
		w.m.admitted(ki, ri, k.cost, int64(now))
	}
	if !a.dirty && a.d.Wants() {
		a.dirty = true
		w.dirty = append(w.dirty, a)
	}
}

// resolved counts the decisions of a's requests that waited, made at t.
func (w *world) resolved(a *agentSim, t int64) {
	for _, res := range a.d.Resolved() {
		if res.Decision.Allowed {
			ki := int(res.Tag)
			w.m.admitted(ki, a.r.idx, w.keys[ki].cost, t)
		}
	}
}

// pollAgents runs, at t, the refreshers of the agents that have work: those
// a decision of this step gave some, those with requests waiting, and, on
// a tick, those whose next tick with work has come.
func (w *world) pollAgents(t int64) {
	keep := w.dirty[:0]
	for _, a := range w.dirty {
		if a.alive {
			w.poll(a, t)
		}
		if a.alive && a.d.Waiting() > 0 {
			keep = append(keep, a) // its deadlines are checked every step
		} else {
			a.dirty = false
		}
	}
	clear(w.dirty[len(keep):])
	w.dirty = keep
	if t < w.nextScan || w.tick == 0 { // no tick: no agent was ever made
		return
	}
	w.nextScan = (t/w.tick + 1) * w.tick
	for _, r := range w.rs {
		for _, a := range r.agents {
			if t >= a.nextTick {
				w.poll(a, t)
			}
		}
	}
}

func (w *world) poll(a *agentSim, t int64) {
	for _, c := range a.d.Poll(dur(t)) {
		w.send(a, c, t)
	}
	w.resolved(a, t)
	a.nextTick = int64(a.d.NextTick())
}

// callNumber numbers the agent's calls sent at t: 0 for the first.
func (a *agentSim) callNumber(t int64) uint64 {
	if a.callAt != t {
		a.callAt, a.callN = t, 0
	} else {
		a.callN++
	}
	return a.callN
}

// send carries a call to the agent's regiond: half a round trip there,
// half the store's latency to Redis and back, half a round trip home.
func (w *world) send(a *agentSim, c *agent.Call, t int64) {
	nw := &w.sc.Network
	rtt := int64(nw.AgentRTT)
	if j := int64(nw.AgentJitter); j > 0 {
		// Drawn for the call, like a report's (reportDraw): an agent's
		// round trips do not depend on how many other calls came before.
		rtt += int64(callDraw(w.sc.Seed, a.id, uint64(t), a.callNumber(t))%uint64(2*j+1)) - j
	}
	rtt = max(rtt, 0)
	redis := int64(w.sc.Redis.Latency)
	exec := t + rtt/2 + redis/2
	reply := t + rtt + redis
	if a.r.unreachable > 0 {
		// The call never reaches regiond and fails at its deadline.
		w.ev.push(event{at: t + int64(c.Timeout), kind: evDone, ag: a, call: c, err: agent.ErrCallTimeout})
		return
	}
	if reply-t > int64(c.Timeout) {
		w.ev.push(event{at: t + int64(c.Timeout), kind: evDone, ag: a, call: c, err: agent.ErrCallTimeout})
		reply = -1
	}
	w.ev.push(event{at: exec, kind: evExec, ag: a, call: c, replyAt: reply})
}

// announceDry carries the region's dry-key notices of the call just run
// (its WatchDry stream) to each of its live agents, half a round trip away.
func (w *world) announceDry(r *regiond, t int64) {
	for {
		select {
		case d := <-r.dry:
			if w.noDry {
				continue
			}
			at := t + int64(w.sc.Network.AgentRTT)/2
			for _, a := range r.agents {
				if a.alive {
					w.ev.push(event{at: at, kind: evDry, ag: a, dry: &d})
				}
			}
		default:
			return
		}
	}
}

// exec runs a call on its region's lease service, with the store acting
// at the current time.
func (w *world) exec(e *event) {
	r := e.ag.r
	out := event{at: e.replyAt, kind: evDone, ag: e.ag, call: e.call}
	if e.call.Lease != nil {
		out.resp, out.err = r.svc.Lease(w.ctx, e.call.Lease)
		w.announceDry(r, e.at)
	} else {
		_, out.err = r.svc.Return(w.ctx, e.call.Return)
	}
	if e.replyAt >= 0 {
		w.ev.push(out)
	}
}
