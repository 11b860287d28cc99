package service

import (
	"time"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// This file is what the service tells an operator (regiond's admin API):
// per rule, the tokens denied and the lease sizes (metrics); per key, its
// recent counts and the top keys (a bounded summary, recent.go); and what
// the memory of dry keys holds of a key. None of it changes a decision.

// noteItem counts one answered lease item of rule r for store key: what its
// agent reported (demand, admitted) and what the region granted.
func (s *Service) noteItem(now time.Time, r *policy.Rule, key string, it *leasev1.LeaseItem, granted int64) {
	rs := s.metrics.rules.of(r.Name)
	// A request waiting for this very call (a cold key's ask, one past its
	// lease) is in demand and not yet admitted: the grant admits it, and the
	// agent reports it admitted with its next call. So the part of demand a
	// grant covers is not counted denied now, nor as demand twice; what is
	// left is what the agent denied itself (its deny cache, a spent lease).
	demand, admitted := it.GetDemand(), min(max(it.GetAdmitted(), 0), max(it.GetDemand(), 0))
	if granted > 0 {
		demand -= min(demand-admitted, granted)
	}
	if d := demand - admitted; d > 0 {
		rs.deniedAgent.Add(float64(d))
	}
	if granted > 0 {
		rs.granted.Observe(float64(granted))
	} else {
		rs.deniedRegion.Add(float64(it.GetWant()))
	}
	s.recent.record(now, r.Name, key, demand, admitted)
}

// Top returns the n keys of rule ("" for every rule) with the most tokens
// denied (byDenied) or asked for (demand) that agents reported over the
// recent window at now, most first, and the window. The counts are a
// bounded summary's estimates (RecentCounts).
func (s *Service) Top(now time.Time, rule string, byDenied bool, n int) ([]TopKey, time.Duration) {
	return s.recent.top(now, rule, byDenied, n)
}

// Recent returns what agents reported of a store key over the recent window
// at now.
func (s *Service) Recent(now time.Time, storeKey string) RecentCounts {
	c, _, _ := s.recent.counts(now, storeKey)
	return c
}

// DryFor returns how long from now the service remembers a store key's
// bucket as unable to grant (0 when it does not), without changing the
// memory.
func (s *Service) DryFor(now time.Time, storeKey string) time.Duration {
	m := s.dry
	if m == nil {
		return 0
	}
	sh := m.shard(storeKey)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	d, ok := sh.cur[storeKey]
	if !ok {
		d, ok = sh.old[storeKey]
	}
	at := now.UnixNano()
	if !ok || at >= d.trust+d.step || at >= d.until {
		return 0
	}
	return time.Duration(d.until - at)
}
