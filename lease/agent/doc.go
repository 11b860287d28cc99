// Package agent is ration's gateway side: a library that decides each
// request locally by spending tokens leased from the region's regiond, so
// that the request path never waits on the network in steady state.
//
// Start an agent with the region's lease API address, wait for the policy,
// and ask it about each request:
//
//	a, err := agent.New(agent.Config{Target: "regiond.eu:7400"})
//	...
//	defer a.Close() // or a.Shutdown(ctx): returns the unused tokens
//	if err := a.WaitPolicy(ctx); err != nil { ... }
//	d := a.Allow(ctx, []policy.Descriptor{{Key: "tenant", Value: "acme"}}, 1)
//	if !d.Allowed { ... 429, or 503 when d.Path is PathFailedClosed ... }
//
// A key holds tokens the region pre-debited for this agent (a lease); a
// background refresher renews leases before they run out, batching keys
// into one call, and returns the tokens of keys that went idle. A key
// without tokens costs one round trip bounded by Config.RoundTripTimeout;
// while the region cannot be reached, each rule's on_error decides
// (DESIGN.md, "Level 1"). A decision on leased keys allocates nothing and
// takes no lock. Every Decision names the rule and the Path that decided
// it; Stats and the ration_agent_* metrics count both.
//
// The decisions are an I/O-free core that the Agent drives with goroutines
// and gRPC, and that Driver drives on a virtual clock for the simulator.
// The subpackages httplimit, grpclimit and envoyrls put an agent in front
// of net/http handlers, gRPC services and Envoy.
package agent
