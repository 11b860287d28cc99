package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// Driver runs one agent's decision and lease logic synchronously, with the
// time as an argument and the round trips to the region left to the caller.
// It is what the simulator runs thousands of, on a virtual clock, in one
// goroutine: no goroutine, timer, connection or clock read of its own.
//
// A Driver is the same agent as New's: the same key states, leased slots,
// deny cache, EWMA lease sizing, low-water refreshes, lease expiry from
// send time, circuit breaker and failure modes (the functions Allow and
// the refresher call). What differs is who moves time and carries calls:
//
//   - Decide decides one request at now. A request whose keys hold tokens
//     is decided at once; one that needs a round trip (a cold key) waits,
//     as Allow would block, and its Decision comes back later from
//     Resolved, tagged.
//   - Poll runs what the refresher goroutine would run at now (its tick,
//     or the wake-up of a key below low water) and returns the calls to
//     send: lease calls (background or for waiting requests) and returns.
//   - Complete hands a call's outcome back at the time it arrived: the
//     response, or the error (a timeout is an error at Sent + Timeout).
//
// Times are durations since the epoch given to NewDriver, which every
// driver of one simulation may share.
//
// A Driver is not safe for concurrent use.
type Driver struct {
	a *Agent
	s *scratch // the next decision's scratch

	spare []*scratch
	out   []*Call
	wait  []*waiter
	done  []Resolution

	// The refresher: at most one call in flight, further ones queued in
	// order, as the refresher goroutine makes them one after the other.
	busy     *Call
	queue    []refresherStep
	nextTick int64 // the first tick after the refresher last ran
	ticked   bool  // a tick came while the refresher was busy
}

// Call is a Lease or Return call the driver asks its caller to carry to
// the region. Exactly one of Lease and Return is set.
type Call struct {
	Lease  *leasev1.LeaseRequest
	Return *leasev1.ReturnRequest
	// Sent is when the call was sent; Timeout how long the agent waits for
	// its answer. An answer later than Sent + Timeout must be dropped and
	// the call completed with an error at Sent + Timeout instead.
	Sent    time.Duration
	Timeout time.Duration

	sent      int64
	f         *flight
	wants     []int64
	rets      *returnBatch
	refresher bool
	completed bool
}

// Resolution is the Decision of a request that waited for a round trip.
type Resolution struct {
	Tag      uint64
	Decision Decision
	At       time.Duration
}

// ErrCallTimeout is a convenient error for Complete when a call's answer
// did not arrive within its Timeout.
var ErrCallTimeout = errors.New("agent: call timed out")

// waiter is a request in the slow path, waiting for round trips.
type waiter struct {
	tag      uint64
	s        *scratch
	start    int64
	deadline int64
	attempt  int
}

// refresherStep is one call the refresher still has to make: a lease call
// for keys (in batches of maxBatch), or returns.
type refresherStep struct {
	pol  *policy.Set
	keys []*keyState
	rets *returnBatch
}

// NewDriver returns a driver for an agent configured by cfg. Its times are
// durations since epoch, and its refresher ticks at whole multiples of the
// tick from epoch. Target, Conn, DialOptions, Registerer and Clock are
// ignored; AgentID is required (a default would be random). Logger
// defaults to discarding.
func NewDriver(cfg Config, epoch time.Time) (*Driver, error) {
	if cfg.AgentID == "" {
		return nil, fmt.Errorf("%w: a Driver needs an AgentID", ErrInvalidConfig)
	}
	cfg.Target, cfg.Conn, cfg.DialOptions, cfg.Registerer = "driver", nil, nil, nil
	cfg.Clock = func() time.Time { return epoch }
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := cfg.ensureDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Agent{
		cfg:    cfg,
		base:   epoch,
		id:     &leasev1.Agent{Id: cfg.AgentID},
		params: newRateParams(cfg.LeasePeriod),
		margin: cfg.LeasePeriod / 20,
		ready:  make(chan struct{}),
		keys:   newKeyMap(),
		wake:   make(chan struct{}, 1),
		br:     breaker{threshold: cfg.BreakerFailures, probeEvery: int64(cfg.ProbeInterval)},
		// One stripe: one goroutine decides, and a single stripe keeps
		// keys off the stripe cache, whose batches only help many cores.
		stripes: make([]stripe, 1),
	}
	a.agents.Store(1)
	a.lead.Store(int64(a.margin))
	a.metrics = &metrics{a: a}
	d := &Driver{a: a, nextTick: int64(a.tick())}
	d.s = d.newScratch()
	return d, nil
}

func (d *Driver) newScratch() *scratch {
	if n := len(d.spare); n > 0 {
		s := d.spare[n-1]
		d.spare = d.spare[:n-1]
		return s
	}
	return &scratch{
		rules:  make([]*policy.Rule, 0, 4),
		res:    make([]ruleResult, 0, 4),
		buf:    make([]byte, 0, 64),
		stripe: &d.a.stripes[0],
	}
}

// SetPolicy installs a rule set, as the policy stream would.
func (d *Driver) SetPolicy(set *policy.Set) {
	if set != nil && set != d.a.pol.Load() {
		d.a.pol.Store(set)
		d.a.ctr.policyUpdates.Add(1)
	}
}

// Stats returns the agent's counters.
func (d *Driver) Stats() Stats { return d.a.Stats() }

// Decide decides a request described by ds at now, as Allow does. It
// returns the Decision and true, or false when the request waits for a
// round trip: its Decision then comes from Resolved, with tag.
func (d *Driver) Decide(now time.Duration, ds []policy.Descriptor, hits int64, tag uint64) (Decision, bool) {
	t := int64(now)
	s := d.s
	dec, slow := d.decideLocal(s, t, ds, hits)
	if !slow {
		d.a.record(s, t, dec)
		return dec, true
	}
	// The slow path: this scratch now belongs to the waiting request.
	d.s = d.newScratch()
	s.memoOK = false
	w := &waiter{tag: tag, s: s, start: t, deadline: t + int64(d.a.cfg.RoundTripTimeout)}
	if d.attempt(w, t) {
		dec := d.resolve(w, t)
		return dec, true
	}
	d.wait = append(d.wait, w)
	return Decision{}, false
}

// decideLocal is the part of Agent.decide that needs no round trip. It
// reports slow when some rule needs the slow path; otherwise the request is
// decided.
func (d *Driver) decideLocal(s *scratch, now int64, ds []policy.Descriptor, hits int64) (Decision, bool) {
	a := d.a
	hits = max(hits, 1)
	if set := a.pol.Load(); s.sameMatch(set, ds, hits) {
		for i := range s.res {
			rr := &s.res[i]
			rr.done, rr.ok, rr.path, rr.retry, rr.f, rr.undo = false, false, PathNone, 0, nil, undoNone
		}
	} else {
		s.memoOK = false
		s.rules = set.Match(s.rules[:0], ds)
		s.res = s.res[:0]
		s.buf = s.buf[:0]
		for _, r := range s.rules {
			start := len(s.buf)
			s.buf = append(s.buf, r.Name...)
			s.buf = append(s.buf, 0)
			s.buf = r.AppendKey(s.buf, ds)
			s.res = append(s.res, ruleResult{rule: r, need: tokens(hits, r.Cost), start: start, end: len(s.buf), nameLen: len(r.Name)})
		}
		for i := range s.res {
			s.res[i].k = a.keys.get(s.buf[s.res[i].start:s.res[i].end])
		}
		s.memoSet, s.memoHits, s.memoOK = set, hits, true
		s.memoDs = append(s.memoDs[:0], ds...)
	}
	if len(s.res) == 0 {
		return Decision{Allowed: true}, false
	}
	slow := false
	for i := range s.res {
		rr := &s.res[i]
		if rr.need > min(rr.rule.Burst, maxSpend) {
			// More than the rule's whole bucket: no lease can ever hold it.
			rr.done, rr.path = true, PathLease
			if rr.k != nil {
				rr.k.denied.Add(min(rr.need, maxSpend))
			}
			if !rr.rule.Shadow {
				return a.finish(s, now), false
			}
			continue
		}
		if rr.k == nil {
			slow = true
			continue
		}
		if j, w, ok := a.take(rr.k, s.stripeIdx, now, rr.need); ok {
			rr.done, rr.ok, rr.path = true, true, PathLease
			rr.undo, rr.slot, rr.word = undoSlot, j, w
			if j < cacheSlot {
				if lw := rr.k.lowWater.Load(); balance(w) < lw && balance(w)+rr.k.slots.otherLive(j, now) < lw {
					a.queueRefresh(rr.k)
				}
			}
			continue
		}
		if du := rr.k.denyUntil.Load(); now < du && rr.k.liveTokens(now) < rr.need {
			rr.done, rr.path, rr.retry = true, PathDenyCache, du-now
			rr.k.denied.Add(rr.need)
			if !rr.rule.Shadow {
				return a.finish(s, now), false
			}
			continue
		}
		slow = true
	}
	if slow {
		return Decision{}, true
	}
	return a.finish(s, now), false
}

// attempt starts one round of Agent.slowPath for w at now: the failure
// modes decide when the region may not be called; otherwise every undecided
// rule joins its key's round trip in flight or a new one. It reports
// whether w is decided.
func (d *Driver) attempt(w *waiter, now int64) bool {
	a, s := d.a, w.s
	if !a.pendingRules(s) {
		return true
	}
	if w.attempt >= maxAttempts {
		d.giveUp(s)
		return true
	}
	w.attempt++
	if a.fromSplitLeases(s, now) && !a.pendingRules(s) {
		return true
	}
	call, probe := a.mayCall(now)
	if !call {
		for i := range s.res {
			if rr := &s.res[i]; !rr.done {
				a.ensureKey(s, rr, now)
				a.failMode(rr, now)
			}
		}
		return true
	}
	s.synced = true
	if own := a.joinOrStart(s, now); own != nil {
		d.out = append(d.out, d.leaseCall(own, now, a.cfg.RoundTripTimeout, false))
	} else if probe {
		a.releaseProbe()
	}
	return false
}

// giveUp denies what is still undecided after every attempt: the tokens
// granted went to other requests each time.
func (d *Driver) giveUp(s *scratch) {
	for i := range s.res {
		if rr := &s.res[i]; !rr.done {
			rr.done, rr.path, rr.retry = true, PathLease, int64(time.Millisecond)
			rr.k.denied.Add(rr.need)
		}
	}
}

// settle continues w at now, once every round trip it waits for is done or
// its deadline has passed, as Agent.slowPath does after its wait. It
// reports whether w is decided.
func (d *Driver) settle(w *waiter, now int64) bool {
	a, s := d.a, w.s
	timedOut := false
	for i := range s.res {
		rr := &s.res[i]
		if rr.done {
			continue
		}
		f := rr.f
		rr.f = nil
		if f == nil || !flightDone(f) {
			timedOut = true
			a.failMode(rr, now) // the region did not answer in time
			continue
		}
		if f.err != nil {
			a.failMode(rr, now)
			continue
		}
		if j, wd, ok := a.take(rr.k, s.stripeIdx, now, rr.need); ok {
			rr.done, rr.ok, rr.path = true, true, PathLease
			rr.undo, rr.slot, rr.word = undoSlot, j, wd
			continue
		}
		if du := rr.k.denyUntil.Load(); now < du {
			rr.done, rr.path, rr.retry = true, PathLease, du-now
			rr.k.denied.Add(rr.need)
			if !rr.rule.Shadow {
				return true
			}
		}
	}
	if timedOut {
		d.giveUp(s)
		return true
	}
	if now >= w.deadline {
		// Another round would find the deadline gone at once.
		for i := range s.res {
			if rr := &s.res[i]; !rr.done {
				a.failMode(rr, now)
			}
		}
		return true
	}
	return d.attempt(w, now)
}

// ready reports whether every round trip w waits for is done.
func (w *waiter) ready() bool {
	for i := range w.s.res {
		if rr := &w.s.res[i]; !rr.done && rr.f != nil && !flightDone(rr.f) {
			return false
		}
	}
	return true
}

// resolve turns a decided waiter into its Decision and recycles its scratch.
func (d *Driver) resolve(w *waiter, now int64) Decision {
	dec := d.a.finish(w.s, now)
	d.a.record(w.s, now, dec)
	w.s.synced = false
	w.s.memoOK = false
	d.spare = append(d.spare, w.s)
	w.s = nil
	return dec
}

// progress moves the waiting requests on at now: those whose round trips
// are done, or whose deadline passed.
func (d *Driver) progress(now int64) {
	keep := d.wait[:0]
	for _, w := range d.wait {
		if w.ready() || now >= w.deadline {
			if d.settle(w, now) {
				d.done = append(d.done, Resolution{Tag: w.tag, Decision: d.resolve(w, now), At: time.Duration(now)})
				continue
			}
		}
		keep = append(keep, w)
	}
	clear(d.wait[len(keep):])
	d.wait = keep
}

// Resolved returns the decisions of waiting requests made since the last
// call, in the order they were made. The slice is reused by the next call.
func (d *Driver) Resolved() []Resolution {
	r := d.done
	d.done = d.done[:0]
	return r
}

// Waiting returns how many requests wait for a round trip.
func (d *Driver) Waiting() int { return len(d.wait) }

// Wants reports whether Poll has work before the next tick: calls to send,
// keys queued for a refresh, or waiting requests.
func (d *Driver) Wants() bool {
	return len(d.out) > 0 || len(d.a.queue) > 0 || len(d.wait) > 0
}

// NextTick returns the refresher's next tick that has work: the first one
// at or after the earliest scheduled check (every tick while the region is
// unreachable, for the probe). Ticks before it would find nothing to do, so
// a caller may skip them; Wants reports work that does not wait for a
// tick.
func (d *Driver) NextTick() time.Duration { return time.Duration(d.nextWake()) }

func (d *Driver) nextWake() int64 {
	a := d.a
	if a.down.Load() {
		return d.nextTick
	}
	a.smu.Lock()
	due := int64(math.MaxInt64)
	if len(a.sched) > 0 {
		due = a.sched[0].due
	}
	a.smu.Unlock()
	if due <= d.nextTick {
		return d.nextTick
	}
	if due > math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	tick := int64(a.tick())
	return (due + tick - 1) / tick * tick
}

// Poll runs, at now, what the refresher goroutine and waiting requests
// would: deadlines of waiting requests, the refresher's tick and the keys
// queued below low water. It returns the calls to send at now; the slice is
// reused by the next call to Poll.
func (d *Driver) Poll(now time.Duration) []*Call {
	t := int64(now)
	if len(d.wait) > 0 {
		d.progress(t)
	}
	if t >= d.nextWake() {
		d.ticked = true
		tick := int64(d.a.tick())
		d.nextTick = (t/tick + 1) * tick
	}
	if d.busy == nil {
		if len(d.queue) == 0 && (d.ticked || len(d.a.queue) > 0) {
			d.ticked = false
			d.refresh(t)
		}
		d.nextRefresherCall(t)
	}
	out := d.out
	d.out = d.out[:0]
	return out
}

// refresh is Agent.refreshOnce: it gathers the queued and due keys, checks
// each, and plans the refresher's calls.
func (d *Driver) refresh(now int64) {
	a := d.a
	var work []*keyState
	work = append(work, a.queue...)
	clear(a.queue)
	a.queue = a.queue[:0]
	select {
	case <-a.wake:
	default:
	}
	work = a.popDue(now, work)
	pol := a.pol.Load()
	rets := &returnBatch{}
	var renew []*keyState
	for _, k := range work {
		if a.check(k, pol, now, rets) == actRefresh {
			renew = append(renew, k)
		}
	}
	if a.down.Load() && len(renew) == 0 {
		if k := a.probeKey.Load(); k != nil && !k.isEvicted() {
			renew = append(renew, k)
		}
	}
	if len(renew) > 0 {
		if call, _ := a.mayCall(now); !call {
			for _, k := range renew {
				a.scheduleBy(k, now+int64(a.cfg.ProbeInterval))
			}
		} else {
			d.queue = append(d.queue, refresherStep{pol: pol, keys: renew})
		}
	}
	if len(rets.items) > 0 {
		d.queue = append(d.queue, refresherStep{rets: rets})
	}
}

// nextRefresherCall makes the refresher's next planned call at now, if any.
func (d *Driver) nextRefresherCall(now int64) {
	a := d.a
	for d.busy == nil && len(d.queue) > 0 {
		st := &d.queue[0]
		if st.rets != nil {
			n := min(len(st.rets.items), maxBatch)
			c := &Call{
				Return:    &leasev1.ReturnRequest{Agent: a.id, Items: st.rets.items[:n:n]},
				Sent:      time.Duration(now),
				Timeout:   a.cfg.RefreshTimeout,
				sent:      now,
				rets:      &returnBatch{items: st.rets.items[:n:n], keys: st.rets.keys[:n:n]},
				refresher: true,
			}
			st.rets.items, st.rets.keys = st.rets.items[n:], st.rets.keys[n:]
			if len(st.rets.items) == 0 {
				d.popStep()
			}
			d.busy = c
			d.out = append(d.out, c)
			return
		}
		// Agent.renew: the keys with no round trip in flight, up to a
		// batch, in one call.
		var f *flight
		used := 0
		for _, k := range st.keys {
			used++
			r := st.pol.Rule(k.rule)
			k.mu.Lock()
			if r != nil && k.flight == nil && !k.evicted.Load() {
				if f == nil {
					f = &flight{done: make(chan struct{})}
				}
				k.flight = f
				f.keys = append(f.keys, k)
				f.rules = append(f.rules, r)
				f.needs = append(f.needs, r.Cost)
			}
			k.mu.Unlock()
			if f != nil && len(f.keys) == maxBatch {
				break
			}
		}
		st.keys = st.keys[used:]
		if len(st.keys) == 0 {
			d.popStep()
		}
		if f != nil {
			// Agent.refreshCall.
			a.ctr.refreshCalls.Add(1)
			a.ctr.refreshItems.Add(int64(len(f.keys)))
			c := d.leaseCall(f, now, a.cfg.RefreshTimeout, true)
			d.busy = c
			d.out = append(d.out, c)
			return
		}
		if a.down.Load() {
			a.releaseProbe()
		}
	}
}

func (d *Driver) popStep() {
	d.queue[0] = refresherStep{}
	d.queue = d.queue[1:]
}

// leaseCall builds the Lease call of flight f sent at now: the first half
// of Agent.leaseCall (sizing each key's lease and reporting its demand).
func (d *Driver) leaseCall(f *flight, sent int64, timeout time.Duration, refresher bool) *Call {
	req, wants := d.a.leaseRequest(f, sent)
	return &Call{Lease: req, Sent: time.Duration(sent), Timeout: timeout, sent: sent, f: f, wants: wants, refresher: refresher}
}

// Complete applies the outcome of call c at now, when its answer arrived
// (resp for a Lease call, nil for a Return) or failed (err). Each call is
// completed once; later completions are ignored.
func (d *Driver) Complete(now time.Duration, c *Call, resp *leasev1.LeaseResponse, err error) {
	if c.completed {
		return
	}
	c.completed = true
	t := max(int64(now), c.sent)
	if c.Lease != nil {
		d.completeLease(c, t, resp, err)
	} else {
		d.completeReturn(c, err)
	}
	if c.refresher && d.busy == c {
		d.busy = nil
	}
	if len(d.wait) > 0 {
		d.progress(t)
	}
}

// completeLease is the second half of Agent.leaseCall.
func (d *Driver) completeLease(c *Call, now int64, resp *leasev1.LeaseResponse, err error) {
	a, f := d.a, c.f
	if err == nil && len(resp.GetGrants()) != len(f.keys) {
		err = fmt.Errorf("agent: region answered %d grants for %d items", len(resp.GetGrants()), len(f.keys))
	}
	a.ctr.leaseCalls.Add(1)
	a.ctr.leaseItems.Add(int64(len(f.keys)))
	a.callDone(now, err == nil)
	if err == nil {
		a.lead.Store(int64(a.rtt.record(time.Duration(now-c.sent)) + a.margin))
		a.agents.Store(max(int64(resp.GetAgents()), 1))
	} else {
		a.ctr.callErrors.Add(1)
	}
	for i, k := range f.keys {
		k.mu.Lock()
		if err == nil {
			a.applyLocked(k, f.rules[i], resp.Grants[i], c.sent, now, c.wants[i])
		} else {
			k.reportedAsked -= c.Lease.Items[i].Demand
			k.reportedAdmitted -= c.Lease.Items[i].Admitted
			a.scheduleBy(k, now+int64(a.cfg.ProbeInterval))
		}
		if k.flight == f {
			k.flight = nil
		}
		k.queued.Store(false)
		k.mu.Unlock()
	}
	f.err = err
	close(f.done)
}

// completeReturn is the bookkeeping of Agent.sendReturns for one call.
func (d *Driver) completeReturn(c *Call, err error) {
	a := d.a
	a.ctr.returnCalls.Add(1)
	a.ctr.returnItems.Add(int64(len(c.rets.items)))
	for i, it := range c.rets.items {
		if err == nil {
			a.ctr.returned.Add(it.Tokens)
			continue
		}
		k := c.rets.keys[i]
		k.mu.Lock()
		k.returned -= it.Tokens
		a.dropLocked(k, it.Tokens)
		k.mu.Unlock()
	}
	if err != nil {
		a.ctr.callErrors.Add(1)
	}
}

// flightDone reports whether f's round trip has completed.
func flightDone(f *flight) bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}
