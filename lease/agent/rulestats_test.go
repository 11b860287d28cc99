package agent

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/durationpb"

	leasev1 "github.com/ration-dev/ration/lease/v1"
)

const twoRulePolicy = `
rules:
  - name: per-tenant
    key: [tenant]
    limit: 1000
    period: 1s
  - name: per-user
    key: [user]
    limit: %d
    period: 1s
`

// TestDecisionsCountedByRule: a decision counts under the rule that
// decided it, one that no rule decided under RuleNone, in Stats and in
// ration_agent_decisions_total{rule,path,outcome} of a real registry; a
// rule keeps its counts through a new policy that keeps its name.
func TestDecisionsCountedByRule(t *testing.T) {
	d, err := NewDriver(Config{AgentID: "a1"}, time.Unix(1_700_000_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	d.SetPolicy(mustPolicy(t, fmt.Sprintf(twoRulePolicy, 1000)))
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, d.Stats)
	if err != nil {
		t.Fatal(err)
	}
	defer m.unregister()
	var now time.Duration
	// answer grants what every call wants, but nothing to user "broke".
	answer := func(calls []*Call) {
		for len(calls) > 0 {
			for _, c := range calls {
				var resp *leasev1.LeaseResponse
				if c.Lease != nil {
					resp = &leasev1.LeaseResponse{Agents: 1, Grants: make([]*leasev1.LeaseGrant, len(c.Lease.Items))}
					for i, it := range c.Lease.Items {
						g := &leasev1.LeaseGrant{Granted: it.Want, Ttl: durationpb.New(time.Second), Rate: 1000, Capacity: 1000, Remaining: 1000}
						if it.Key == "user=broke" {
							g.Granted, g.RetryAfter = 0, durationpb.New(time.Second)
						}
						resp.Grants[i] = g
					}
				}
				d.Complete(now, c, resp, nil)
			}
			calls = d.Poll(now)
		}
		d.Resolved()
	}
	decide := func(kv ...string) {
		t.Helper()
		if _, ok := d.Decide(now, ds(kv...), 1, 0); !ok {
			answer(d.Poll(now))
		}
	}
	for range 3 {
		decide("tenant", "acme")
	}
	decide("user", "bob")
	decide("user", "broke") // waits for a round trip, which grants nothing
	decide("user", "broke") // the deny cache
	decide("nobody", "x")   // no rule matches
	d.SetPolicy(mustPolicy(t, fmt.Sprintf(twoRulePolicy, 2000)))
	decide("user", "bob")

	byRule := d.Stats().DecisionsByRule
	for _, tt := range []struct {
		rule    string
		path    Path
		allowed int
		want    uint64
	}{
		{"per-tenant", PathLease, 1, 3},
		{"per-user", PathLease, 1, 2},
		{"per-user", PathLease, 0, 1},
		{"per-user", PathDenyCache, 0, 1},
		{RuleNone, PathNone, 1, 1},
	} {
		if got := byRule[tt.rule][tt.path][tt.allowed]; got != tt.want {
			t.Errorf("Stats.DecisionsByRule[%q][%v][%d] got %d, want %d", tt.rule, tt.path, tt.allowed, got, tt.want)
		}
	}
	if got, want := d.Stats().Total(), uint64(8); got != want {
		t.Errorf("Stats.Total got %d, want %d", got, want)
	}

	want := fmt.Sprintf(`# HELP ration_agent_decisions_total %s
# TYPE ration_agent_decisions_total counter
ration_agent_decisions_total{outcome="allowed",path="LEASE",rule="per-tenant"} 3
ration_agent_decisions_total{outcome="allowed",path="LEASE",rule="per-user"} 2
ration_agent_decisions_total{outcome="allowed",path="NONE",rule="_none"} 1
ration_agent_decisions_total{outcome="denied",path="DENY_CACHE",rule="per-user"} 1
ration_agent_decisions_total{outcome="denied",path="LEASE",rule="per-user"} 1
`, decisionsHelp)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ration_agent_decisions_total"); err != nil {
		t.Error(err)
	}
}

// TestRuleNamesBounded: past maxRuleNames names, decisions count under
// RuleOther; a name seen before keeps its own block.
func TestRuleNamesBounded(t *testing.T) {
	var rt ruleTable
	rt.init(2)
	first := rt.blockLocked("r0")
	for i := 1; i < maxRuleNames; i++ {
		if rs := rt.blockLocked(fmt.Sprint("r", i)); rs.name != fmt.Sprint("r", i) {
			t.Fatalf("name %d of %d counts under %q", i, maxRuleNames, rs.name)
		}
	}
	if rs := rt.blockLocked("one-too-many"); rs.name != RuleOther {
		t.Errorf("name %d counts under %q, want %q", maxRuleNames+1, rs.name, RuleOther)
	}
	if rs := rt.blockLocked("r0"); rs != first {
		t.Error("a name seen before got a new block")
	}
	if got := len(rt.snapshot()); got != maxRuleNames+2 {
		t.Errorf("%d blocks, want %d: the names, %s and %s", got, maxRuleNames+2, RuleNone, RuleOther)
	}
}

// TestDenyCacheIsAllocationFree: a key gets its rare state, where denials
// are counted, before its deny cache entry (from a grant or a dry notice),
// so that even the first denial from the deny cache allocates nothing.
func TestDenyCacheIsAllocationFree(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations differ under the race detector")
	}
	d, err := NewDriver(Config{AgentID: "a1"}, time.Unix(1_700_000_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	set := mustPolicy(t, fmt.Sprintf(twoRulePolicy, 1000))
	d.SetPolicy(set)

	// A grant of nothing, as a background refresh may get.
	c := &d.c
	k := c.keys.getOrCreate([]byte("per-user\x00user=refreshed"), func(id []byte) *keyState { return newKeyState(id, len("per-user"), 0) })
	k.mu.Lock()
	c.applyLocked(k, set.Rule("per-user"), &leasev1.LeaseGrant{RetryAfter: durationpb.New(time.Second)}, 0, 0, 1)
	k.mu.Unlock()
	if k.denyUntil.Load() <= 0 || k.rare.Load() == nil {
		t.Errorf("after a grant of nothing: deny until %d, rare state %v; want a deny cache entry and rare state", k.denyUntil.Load(), k.rare.Load())
	}

	// A dry notice on a key whose one leased token is spent: its next
	// decision is its first denial.
	req := ds("user", "dry")
	if _, ok := d.Decide(0, req, 1, 0); ok {
		t.Fatal("a new key was decided without a round trip")
	}
	for _, call := range d.Poll(0) {
		g := &leasev1.LeaseGrant{Granted: call.Lease.Items[0].Want, Ttl: durationpb.New(time.Second)}
		d.Complete(0, call, &leasev1.LeaseResponse{Agents: 1, Grants: []*leasev1.LeaseGrant{g}}, nil)
	}
	if r := d.Resolved(); len(r) != 1 || !r[0].Decision.Allowed {
		t.Fatalf("resolved %+v, want the request allowed", r)
	}
	if !d.Dry(0, "per-user", "user=dry", time.Hour) {
		t.Fatal("the dry notice found no key")
	}
	d.Decide(0, ds("nobody", "x"), 1, 0) // the scratch's first match allocates its memo
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	dec, ok := d.Decide(0, req, 1, 0)
	runtime.ReadMemStats(&after)
	if !ok || dec.Path != PathDenyCache {
		t.Fatalf("got %+v, %v, want a deny cache decision", dec, ok)
	}
	if n := after.Mallocs - before.Mallocs; n != 0 {
		t.Errorf("the first deny cache decision allocates %d times, want 0", n)
	}
}
