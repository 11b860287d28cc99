package agent

import (
	"sync/atomic"
	"time"
)

// stripe holds a counter written by the request path. Each pooled scratch
// is tied to one stripe, and sync.Pool hands a P its own scratch, so
// counting a decision is an uncontended atomic add rather than a cache line
// bouncing between cores. The decisions themselves are counted by rule, on
// the same stripes (ruleStats).
type stripe struct {
	synced atomic.Uint64
	_      [cacheLine]byte
}

// counters are the agent's cumulative events off the request path.
type counters struct {
	leaseCalls, leaseItems, returnCalls, returnItems, callErrors atomic.Int64
	refreshCalls, refreshItems                                   atomic.Int64
	granted, dropped, returned                                   atomic.Int64
	fallbacks, breakerOpened, evicted                            atomic.Int64
	policyUpdates, policyErrors                                  atomic.Int64
}

// Stats is a snapshot of an agent's counters since New.
type Stats struct {
	// Decisions counts decisions by path, as [path][0] denied and
	// [path][1] allowed.
	Decisions [numPaths][2]uint64
	// DecisionsByRule counts them, the same way, by the rule that decided
	// (Decision.Rule): RuleNone for decisions no rule decided, RuleOther
	// for rules beyond the first 1024 names the agent saw.
	DecisionsByRule map[string][numPaths][2]uint64
	// SyncDecisions counts decisions that waited for a round trip.
	SyncDecisions uint64
	// LeaseCalls counts Lease calls (each may carry many keys) and
	// LeaseItems the keys they carried (one allocator operation each);
	// ReturnCalls and ReturnItems the same for returns.
	LeaseCalls, LeaseItems, ReturnCalls, ReturnItems int64
	// RefreshCalls and RefreshItems are the part of LeaseCalls and
	// LeaseItems made by the background refresher, which batches keys.
	RefreshCalls, RefreshItems int64
	// CallErrors counts Lease and Return calls that failed.
	CallErrors int64
	// TokensGranted, TokensDropped and TokensReturned count tokens leased,
	// dropped unspent (at lease expiry, or lost with a failed return) and
	// given back.
	TokensGranted, TokensDropped, TokensReturned int64
	// FallbackActivations counts keys switching to their emergency bucket.
	FallbackActivations int64
	// BreakerOpenings counts the times the region became unreachable.
	BreakerOpenings int64
	// BreakerOpen reports whether the region is unreachable now.
	BreakerOpen bool
	// Keys is the number of keys held; Evictions counts idle keys forgotten.
	Keys      int
	Evictions int64
	// Agents is the number of agents in the region, as it last said.
	Agents int64
	// RoundTripP99 is the agent's estimate of the p99 Lease round trip.
	RoundTripP99 time.Duration
	// PolicyVersion is the version of the policy in force ("" before one).
	PolicyVersion string
	// PolicyUpdates and PolicyErrors count policies applied and refused.
	PolicyUpdates, PolicyErrors int64
}

// StoreOps returns the allocator operations the agent caused: one per key
// of every Lease and Return call.
func (s Stats) StoreOps() int64 { return s.LeaseItems + s.ReturnItems }

// Total returns the number of decisions made.
func (s Stats) Total() uint64 {
	var n uint64
	for p := range s.Decisions {
		n += s.Decisions[p][0] + s.Decisions[p][1]
	}
	return n
}

// SyncShare returns the share of decisions that needed a round trip.
func (s Stats) SyncShare() float64 {
	if t := s.Total(); t > 0 {
		return float64(s.SyncDecisions) / float64(t)
	}
	return 0
}

// stats returns the core's counters.
func (c *core) stats() Stats {
	var s Stats
	s.DecisionsByRule = c.rules.snapshot()
	for _, d := range s.DecisionsByRule {
		for p := range d {
			s.Decisions[p][0] += d[p][0]
			s.Decisions[p][1] += d[p][1]
		}
	}
	for i := range c.stripes {
		s.SyncDecisions += c.stripes[i].synced.Load()
	}
	t := &c.ctr
	s.LeaseCalls, s.LeaseItems, s.ReturnCalls, s.ReturnItems = t.leaseCalls.Load(), t.leaseItems.Load(), t.returnCalls.Load(), t.returnItems.Load()
	s.RefreshCalls, s.RefreshItems = t.refreshCalls.Load(), t.refreshItems.Load()
	s.CallErrors = t.callErrors.Load()
	s.TokensGranted, s.TokensDropped, s.TokensReturned = t.granted.Load(), t.dropped.Load(), t.returned.Load()
	s.FallbackActivations, s.BreakerOpenings, s.Evictions = t.fallbacks.Load(), t.breakerOpened.Load(), t.evicted.Load()
	s.PolicyUpdates, s.PolicyErrors = t.policyUpdates.Load(), t.policyErrors.Load()
	s.BreakerOpen = c.down.Load() && !c.closed.Load()
	s.Keys = c.keys.len()
	s.Agents = c.agents.Load()
	s.RoundTripP99 = c.rtt.get()
	s.PolicyVersion = c.pol.Load().Version()
	return s
}
