package agent

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// core is an agent's decisions without their I/O: the key states, leased
// slots, stripes, deny cache, EWMA lease sizing, refresh schedule and queue,
// circuit breaker and counters. Time is an argument (agent nanoseconds:
// since New's start, or since a Driver's epoch) and the round trips to the
// region are values: the core returns the Calls it needs and takes their
// outcomes back (complete). It starts no goroutine and reads no clock, so
// the Agent, which carries its calls over gRPC from goroutines, and the
// simulator's Driver, which carries them on a virtual clock, run the same
// rules.
//
// Deciding (decideLocal, and the slow path's slowAttempt and slowSettle) is
// safe for concurrent use: atomics on the request path, a mutex per key
// and one per shared structure elsewhere. The refresher's sequencing
// (planWakeUp, nextRefresherCall) belongs to one goroutine at a time.
type core struct {
	// Read by every decision: first, beside the runtime's hot fields.
	pol     atomic.Pointer[policy.Set]
	keys    *keyMap
	stripes []stripe
	// wall is the wall clock at agent time zero (Unix nanoseconds), which
	// places a fixed window's decisions in their window; windows holds
	// the current window of each fixed-window rule of pol.
	wall    atomic.Int64
	windows atomic.Pointer[windowSet]

	cfg    Config // defaults filled, valid
	id     *leasev1.Agent
	params rateParams
	margin time.Duration // added to the p99 round trip to give the refresh lead

	agents atomic.Int64 // agents in the region, from the last response
	lead   atomic.Int64 // nanos: p99 round trip + margin
	rtt    rttTracker

	bmu      sync.Mutex
	br       breaker
	down     atomic.Bool              // the breaker is open, or the agent closed
	closed   atomic.Bool              // shut down: the region is never called again
	probeKey atomic.Pointer[keyState] // a key that needed the region while it was down

	qmu   sync.Mutex
	queue []*keyState // keys whose balance fell below low water
	// wake is signalled, never blocking, when a key is queued, for a
	// runtime whose refresher sleeps between wake-ups.
	wake chan struct{}

	smu   sync.Mutex
	sched schedule

	ctr   counters
	rules ruleTable // decision counters by rule
	// onGrant, when set (before the core is used), is told of every grant
	// by rule name (its counters' label), as the grant arrives.
	onGrant func(rule string, tokens int64)
	ref     refresher
}

// init prepares c for cfg (defaults filled, valid) with the given number of
// decision stripes.
func (c *core) init(cfg Config, stripes int) {
	c.cfg = cfg
	c.id = &leasev1.Agent{Id: cfg.AgentID}
	c.params = newRateParams(cfg.LeasePeriod)
	c.margin = cfg.LeasePeriod / 20
	c.keys = newKeyMap()
	c.stripes = make([]stripe, stripes)
	c.rules.init(stripes)
	c.wake = make(chan struct{}, 1)
	c.br = breaker{threshold: cfg.BreakerFailures, probeEvery: int64(cfg.ProbeInterval)}
	c.agents.Store(1)
	c.lead.Store(int64(c.margin))
}

// setPolicy installs a rule set, reporting whether it replaced another.
func (c *core) setPolicy(set *policy.Set) bool {
	if set == nil || set == c.pol.Load() {
		return false
	}
	// The windows first: a decision that sees the new policy finds its
	// rules' caches (one still on the old policy computes its windows).
	c.windows.Store(newWindowSet(set))
	c.rules.setPolicy(set)
	c.pol.Store(set)
	c.ctr.policyUpdates.Add(1)
	return true
}

// policy returns the rule set in force (nil before the first one).
func (c *core) policy() *policy.Set { return c.pol.Load() }

// policyRefused counts a policy from the region that did not parse.
func (c *core) policyRefused() { c.ctr.policyErrors.Add(1) }

// agent names this agent in its calls to the region.
func (c *core) agent() *leasev1.Agent { return c.id }

// close stops the core from calling the region: from now on every rule
// that needs it is decided by its failure mode.
func (c *core) close() {
	c.closed.Store(true)
	c.down.Store(true)
}

// stripe returns decision stripe i (of numStripes), where a scratch counts
// its decisions and which picks its stripe cache entries.
func (c *core) stripe(i int) *stripe { return &c.stripes[i] }

func (c *core) numStripes() int { return len(c.stripes) }

// woken returns the channel signalled when a key is queued for a refresh.
func (c *core) woken() <-chan struct{} { return c.wake }

// hasQueued reports whether keys are queued for a refresh.
func (c *core) hasQueued() bool {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return len(c.queue) > 0
}

// nextCheck returns when the refresher next has work without a key being
// queued: at once while the region is unreachable (every tick may probe),
// else the earliest scheduled check (math.MaxInt64 for none).
func (c *core) nextCheck() int64 {
	if c.down.Load() {
		return math.MinInt64
	}
	c.smu.Lock()
	defer c.smu.Unlock()
	if len(c.sched) > 0 {
		return c.sched[0].due
	}
	return math.MaxInt64
}

// drainAll empties every key at now for a shutdown, marking each evicted,
// and returns their live tokens to give back.
func (c *core) drainAll(now int64) *returnBatch {
	b := &returnBatch{}
	pol := c.pol.Load()
	c.keys.each(func(k *keyState) {
		k.mu.Lock()
		live, dropped := k.drain(now)
		c.dropLocked(k, dropped)
		c.giveBackLocked(k, pol.Rule(k.rule()), now, live, b)
		k.flags.set(flagEvicted, true)
		k.mu.Unlock()
	})
	return b
}
