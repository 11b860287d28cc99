package agent

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// TestSyncGrantWaitsForItsRequest: on a loaded machine the round-trip
// estimate grows until a fresh lease looks about to expire on arrival. The
// refresher's check that runs between a synchronous grant and its waiting
// request's turn must leave the token for that request, not give it back
// (a Return, a store operation that admits nothing, and the request then
// finds nothing); once the request had its time, the check goes on as
// before.
func TestSyncGrantWaitsForItsRequest(t *testing.T) {
	var c core
	c.init(Config{AgentID: "a1", Target: "x", Logger: quietLogger()}.withDefaults(), 1)
	set := mustPolicy(t, longTailPolicy)
	c.setPolicy(set)
	r := set.Rule("user")
	k := c.keys.getOrCreate([]byte("user\x00user=u1"), func(id []byte) *keyState { return newKeyState(id, 4, 0) })
	k.mu.Lock()
	k.rareLocked() // a key that was denied before: the dry keys this is about
	k.mu.Unlock()
	c.rtt.record(95 * time.Millisecond) // a slow round trip a moment ago
	f := &flight{done: make(chan struct{}), sync: true, keys: []*keyState{k}, rules: []*policy.Rule{r}, needs: []int64{1}}
	k.flight = f
	req, wants := c.leaseRequest(f, 0)
	resp := &leasev1.LeaseResponse{Agents: 20, Grants: []*leasev1.LeaseGrant{{
		Granted: 1, Ttl: durationpb.New(100 * time.Millisecond), Rate: 2, Capacity: 4,
	}}}
	if err := c.leaseDone(f, req, wants, 0, 5*ms, 5*time.Millisecond, resp, nil); err != nil {
		t.Fatal(err)
	}
	rets := &returnBatch{}
	c.check(k, set, 6*ms, rets)
	if len(rets.items) != 0 {
		t.Fatalf("the check gave back %d items of a grant its request has not taken yet", len(rets.items))
	}
	if _, _, ok := c.take(k, 0, 7*ms, 1); !ok {
		t.Fatal("the request found no token after the check")
	}

	// A grant whose request never comes for it is left until the request
	// had a round trip's time: here its lease expires first, and is
	// dropped unspent rather than returned (no store operation).
	f = &flight{done: make(chan struct{}), sync: true, keys: []*keyState{k}, rules: []*policy.Rule{r}, needs: []int64{1}}
	k.flight = f
	req, wants = c.leaseRequest(f, 10*ms)
	if err := c.leaseDone(f, req, wants, 10*ms, 15*ms, 5*time.Millisecond, resp, nil); err != nil {
		t.Fatal(err)
	}
	settle := k.rare.Load().settleBy
	if settle <= 15*ms {
		t.Fatalf("settleBy %v, want after the grant at 15ms", time.Duration(settle))
	}
	c.check(k, set, 50*ms, rets)
	c.check(k, set, settle, rets)
	if len(rets.items) != 0 || k.liveTokens(settle) != 0 || c.stats().TokensDropped != 1 {
		t.Fatalf("gave back %v, %d live, %d dropped; want the expired token dropped", rets.items, k.liveTokens(settle), c.stats().TokensDropped)
	}
}
