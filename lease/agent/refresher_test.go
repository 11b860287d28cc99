package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	leasev1 "github.com/ration-dev/ration/lease/v1"
)

// TestRefresherMakesOneCallAtATime: a wake-up with more keys to renew than
// one call carries makes calls of maxBatch keys, one at a time, each once
// the previous one has completed; the refresher stays busy until the last.
func TestRefresherMakesOneCallAtATime(t *testing.T) {
	var c core
	c.init(Config{AgentID: "a1", Target: "x", Logger: quietLogger()}.withDefaults(), 1)
	set := mustPolicy(t, "rules:\n  - {name: r, key: [tenant], limit: 1000000}\n")
	c.setPolicy(set)
	for i := range 2500 {
		id := fmt.Appendf(nil, "r\x00tenant=t%d", i)
		k := c.keys.getOrCreate(id, func(id []byte) *keyState { return newKeyState(id, 1, 0) })
		k.lowWater.Store(1) // as a grant sets it: the key spent below it
		c.queueRefresh(k)
	}
	c.planWakeUp(0)
	var sizes []int
	for call := c.nextRefresherCall(0); call != nil; call = c.nextRefresherCall(0) {
		if c.nextRefresherCall(0) != nil {
			t.Fatal("a second call while one is in flight")
		}
		n := len(call.Lease.GetItems())
		sizes = append(sizes, n)
		resp := &leasev1.LeaseResponse{Grants: make([]*leasev1.LeaseGrant, n), Agents: 1}
		if err := c.complete(call, ms, time.Millisecond, resp, nil); err != nil {
			t.Fatal(err)
		}
		if len(sizes) < 3 && !c.refresherBusy() {
			t.Fatalf("the refresher is idle after %d of 3 calls", len(sizes))
		}
	}
	if diff := cmp.Diff([]int{1000, 1000, 500}, sizes); diff != "" {
		t.Errorf("keys per call (-want +got):\n%s", diff)
	}
	if c.refresherBusy() {
		t.Error("the refresher is still busy after its last call")
	}
	if s := c.stats(); s.RefreshCalls != 3 || s.RefreshItems != 2500 {
		t.Errorf("got %d refresh calls of %d items, want 3 of 2500", s.RefreshCalls, s.RefreshItems)
	}
}
