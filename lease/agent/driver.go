package agent

import (
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
// A Driver is the same agent as New's: the same core (key states, leased
// slots, deny cache, EWMA lease sizing, low-water refreshes, lease expiry
// from send time, circuit breaker, failure modes and the refresher's
// sequence of calls), without the runtime that carries its calls over
// gRPC. What differs is who moves time and carries calls:
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
	c         core
	rtTimeout int64    // nanos: how long a request waits for its round trips
	s         *scratch // the next decision's scratch

	spare []*scratch
	out   []*Call
	wait  []*waiter
	done  []Resolution

	nextTick int64 // the first tick after the refresher last ran
	ticked   bool  // a tick came while the refresher was busy
}

// Resolution is the Decision of a request that waited for a round trip.
type Resolution struct {
	Tag      uint64
	Decision Decision
	At       time.Duration
}

// waiter is a request in the slow path, waiting for round trips.
type waiter struct {
	tag      uint64
	s        *scratch
	deadline int64
	attempt  int
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
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &Driver{rtTimeout: int64(cfg.RoundTripTimeout)}
	// One stripe: one goroutine decides, and a single stripe keeps keys off
	// the stripe cache, whose batches only help many cores.
	d.c.init(cfg, 1)
	d.c.wall.Store(epoch.UnixNano())
	d.nextTick = int64(d.c.tick())
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
		stripe: d.c.stripe(0),
	}
}

// SetPolicy installs a rule set, as the policy stream would.
func (d *Driver) SetPolicy(set *policy.Set) { d.c.setPolicy(set) }

// Stats returns the agent's counters.
func (d *Driver) Stats() Stats { return d.c.stats() }

// Dry applies at now a region's notice that key of rule cannot be granted
// for retry (lease/v1's WatchDry): a key the Driver holds denies locally
// until then. It reports whether the key was held.
func (d *Driver) Dry(now time.Duration, rule, key string, retry time.Duration) bool {
	return d.c.noteDry(rule, key, retry, int64(now))
}

// Decide decides a request described by ds at now, as Allow does. It
// returns the Decision and true, or false when the request waits for a
// round trip: its Decision then comes from Resolved, with tag.
func (d *Driver) Decide(now time.Duration, ds []policy.Descriptor, hits int64, tag uint64) (dec Decision, decided bool) {
	t := int64(now)
	s := d.s
	// Written in place into the result, as Allow does.
	if !d.c.decideLocal(&dec, s, t, ds, hits) {
		d.c.count(s, dec.Path, dec.Allowed)
		return dec, true
	}
	// The slow path: this scratch now belongs to the waiting request.
	d.s = d.newScratch()
	s.memoOK = false
	w := &waiter{tag: tag, s: s, deadline: t + d.rtTimeout}
	if d.attempt(w, t) {
		return d.resolve(w, t), true
	}
	d.wait = append(d.wait, w)
	return Decision{}, false
}

// attempt starts w's next attempt of the slow path at now, sending the
// flight it starts, if any. It reports whether w is decided.
func (d *Driver) attempt(w *waiter, now int64) bool {
	own, decided := d.c.slowAttempt(w.s, w.attempt, now)
	w.attempt++
	if own != nil {
		d.out = append(d.out, d.c.roundTrip(own, now))
	}
	return decided
}

// settle continues w at now, once every round trip it waits for is done or
// its deadline has passed, as Allow does after its wait. It reports
// whether w is decided.
func (d *Driver) settle(w *waiter, now int64) bool {
	return d.c.slowSettle(w.s, now, now >= w.deadline) || d.attempt(w, now)
}

// ready reports whether every round trip w waits for is done.
func (w *waiter) ready() bool { return w.s.awaited() == nil }

// resolve turns a decided waiter into its Decision and recycles its scratch.
func (d *Driver) resolve(w *waiter, now int64) Decision {
	dec := d.c.finish(w.s, now)
	d.c.count(w.s, dec.Path, dec.Allowed)
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
	return len(d.out) > 0 || len(d.wait) > 0 || d.c.hasQueued()
}

// Tick returns the refresher's tick: every NextTick is a whole multiple of
// it (since the epoch). A simulator that scans its drivers on ticks takes
// the period from here rather than repeating the agent's rule.
func (d *Driver) Tick() time.Duration { return d.c.tick() }

// NextTick returns the refresher's next tick that has work: the first one
// at or after the earliest scheduled check (every tick while the region is
// unreachable, for the probe). Ticks before it would find nothing to do, so
// a caller may skip them; Wants reports work that does not wait for a
// tick.
func (d *Driver) NextTick() time.Duration { return time.Duration(d.nextWake()) }

func (d *Driver) nextWake() int64 {
	due := d.c.nextCheck()
	if due <= d.nextTick {
		return d.nextTick
	}
	if due > math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	tick := int64(d.c.tick())
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
		tick := int64(d.c.tick())
		d.nextTick = (t/tick + 1) * tick
	}
	if !d.c.refresherBusy() && (d.ticked || d.c.hasQueued()) {
		d.ticked = false
		d.c.planWakeUp(t)
	}
	if call := d.c.nextRefresherCall(t); call != nil {
		d.out = append(d.out, call)
	}
	out := d.out
	d.out = d.out[:0]
	return out
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
	d.c.complete(c, t, time.Duration(t-c.sent), resp, err)
	if len(d.wait) > 0 {
		d.progress(t)
	}
}
