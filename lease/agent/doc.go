// Package agent is ration's gateway side: a library that decides each
// request locally by spending tokens leased from the region's regiond, so
// that the request path never waits on the network in steady state.
//
// Start an agent with the region's lease API address, wait for the policy,
// and ask it about each request:
//
//	a, err := agent.New(agent.Config{Target: "regiond.eu:7400"})
//	...
//	defer a.Close()
//	if err := a.WaitPolicy(ctx); err != nil { ... }
//	d := a.Allow(ctx, []policy.Descriptor{{Key: "tenant", Value: "acme"}}, 1)
//	if !d.Allowed { ... 429, or 503 when d.Path is PathFailedClosed ... }
//
// How it works (DESIGN.md, "Level 1"): policy arrives on the region's
// WatchPolicy stream. Each key (a rule plus the descriptor values it keys on)
// holds tokens the region pre-debited for this agent: a lease, sized from an
// average of the key's recent demand and spent with one atomic operation per
// rule. A background refresher renews leases before they run out, batching
// all keys into one Lease call, and returns the tokens of keys that went
// idle. A lease expires τ after its request was sent. A key without tokens
// costs one synchronous round trip bounded by Config.RoundTripTimeout; a key
// the region has just refused is denied locally until its retry time (the
// deny cache). When the region cannot be reached, each rule's on_error
// decides: local (held leases, then an emergency bucket at the region's rate
// ÷ agents × headroom), open or closed. Recovery is automatic.
//
// A decision on leased keys allocates nothing and takes no lock: the
// request's match is memoised per P, tokens are spent with one atomic add,
// and a hot key's leases are split into per-core batches (a stripe cache)
// so that cores deciding the same key do not contend on one cache line.
//
// Every Decision names the rule that decided and the Path that decided it;
// Stats and the ration_agent_* metrics count both. The subpackages
// httplimit and grpclimit put an agent in front of net/http handlers and
// gRPC services.
package agent
