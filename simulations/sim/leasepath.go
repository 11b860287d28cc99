package sim

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ration-dev/ration/lease"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// The simulator serves agents' calls in one of two ways. ViaService runs
// the real lease/service handlers (validation, metrics, a context per
// store call). The default calls the region's store the same way
// lease/service does, without what only costs time in a simulation: the
// same store keys, limits, grants, response fields, agent count and
// exchange tallies. TestDirectPathMatchesService checks that both give
// byte-identical results.

// agentWindow is lease/service's default AgentWindow: agents seen within
// it count toward the region's agents.
const agentWindow = 10 * time.Second

// agentSet counts the agents that called within agentWindow, pruned at
// most every quarter window, as lease/service's agentSet does.
type agentSet struct {
	last      map[string]int64
	lastPrune int64
}

func (a *agentSet) saw(id string, now int64) {
	if a.last == nil {
		a.last = map[string]int64{}
	}
	a.last[id] = now
}

func (a *agentSet) count(now int64) int {
	if now-a.lastPrune >= int64(agentWindow/4) {
		a.lastPrune = now
		for id, t := range a.last {
			if now-t >= int64(agentWindow) {
				delete(a.last, id)
			}
		}
	}
	return len(a.last)
}

// leaseDirect answers a Lease call on region r's store at the current time.
func (w *world) leaseDirect(r *regiond, req *leasev1.LeaseRequest) *leasev1.LeaseResponse {
	items := req.GetItems()
	now := w.base.Add(dur(w.now))
	n := len(items)
	if cap(r.grants) < n {
		r.grants = make([]lease.GrantRequest, n)
		r.out = make([]lease.Grant, n)
		r.rules = make([]*policy.Rule, n)
	}
	grants, out, rules := r.grants[:n], r.out[:n], r.rules[:n]
	for i, it := range items {
		rule := w.set.Rule(it.GetRule())
		key := storeKey(rule.Name, it.GetKey())
		rules[i] = rule
		grants[i] = lease.GrantRequest{Key: key, Want: it.GetWant(), Limit: w.limitOf(r, key)}
	}
	r.seen.saw(req.GetAgent().GetId(), w.now)
	r.store.GrantAt(now, grants, out)
	resp := &leasev1.LeaseResponse{
		Grants: make([]*leasev1.LeaseGrant, n),
		Agents: int32(min(r.seen.count(w.now), 1<<31-1)),
		Region: r.name,
	}
	for i, g := range out {
		rule := rules[i]
		lg := &leasev1.LeaseGrant{
			Granted: g.Granted, Ttl: w.ttlpb, Rate: g.Rate, Capacity: g.Capacity, Remaining: g.Tokens,
			Limit: rule.Limit, Period: durationpb.New(rule.Period),
		}
		if g.Err != nil {
			lg.Granted = 0
		} else if g.Granted == 0 {
			lg.RetryAfter = durationpb.New(g.RetryAfter)
		}
		resp.Grants[i] = lg
		if w.alg == Escrow && rule.Scope != policy.ScopeRegion {
			r.st.Observe(grants[i].Key, items[i].GetDemand(), lg.Granted)
		}
	}
	clear(grants)
	return resp
}

// returnDirect credits a Return call on region r's store.
func (w *world) returnDirect(r *regiond, req *leasev1.ReturnRequest) error {
	items := req.GetItems()
	rets := make([]lease.ReturnRequest, len(items))
	for i, it := range items {
		key := storeKey(it.GetRule(), it.GetKey())
		rets[i] = lease.ReturnRequest{Key: key, Tokens: it.GetTokens(), Limit: w.limitOf(r, key)}
	}
	r.seen.saw(req.GetAgent().GetId(), w.now)
	return r.store.ReturnAt(w.base.Add(dur(w.now)), rets)
}

// storeKey is lease/service's allocator key of one rule's key.
func storeKey(rule, key string) string { return rule + "/" + key }
