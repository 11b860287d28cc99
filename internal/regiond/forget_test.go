package regiond

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/sync/exchange"
)

// TestShareWritesForgetDryKeys: a share the exchange writes (or deletes)
// through the daemon's store makes the lease service ask the store again
// for a key it remembered dry, since the new share may have tokens at once.
func TestShareWritesForgetDryKeys(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	pol, err := policy.Parse("p.yaml", []byte("rules:\n  - {name: r, key: [k], limit: 10, period: 1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	mem := lease.NewMemoryStore(lease.MemoryConfig{Clock: clock})
	keeper, err := service.NewShareKeeper(service.ShareKeeperConfig{Store: mem, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(service.Config{Region: "eu", Store: keeper, Policy: pol, Clock: clock, InitialShare: 500_000})
	if err != nil {
		t.Fatal(err)
	}
	fx := forgetting{mem, svc, keeper, new(atomic.Pointer[exchange.Exchanger])}
	ctx := context.Background()
	ask := func() int64 {
		t.Helper()
		resp, err := svc.Lease(ctx, &leasev1.LeaseRequest{Agent: &leasev1.Agent{Id: "a"}, Items: []*leasev1.LeaseItem{{Rule: "r", Key: "k=1", Want: 10}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Grants[0].GetGranted()
	}
	key := policy.StoreKey("r", "k=1")
	limit := service.Limit(pol.Rule("r"), 500_000, now)
	for _, write := range []func() error{
		func() error {
			return fx.SetShares(ctx, []lease.ShareUpdate{{Key: key, SharePPM: 1_000_000, Limit: limit}}, make([]lease.ShareResult, 1))
		},
		func() error { return fx.DeleteShares(ctx, []string{key}) },
	} {
		for i := 0; i < 100 && ask() > 0; i++ { // drain the bucket; the service then remembers it dry
		}
		before, _ := svc.StoreItems()
		ask()
		if after, _ := svc.StoreItems(); after != before {
			t.Fatalf("a dry key's ask reached the store (%d items, %d before)", after, before)
		}
		if err := write(); err != nil {
			t.Fatal(err)
		}
		before, _ = svc.StoreItems()
		ask()
		if after, _ := svc.StoreItems(); after != before+1 {
			t.Fatalf("after a share write the ask did not reach the store (%d items, %d before)", after, before)
		}
	}
}

// TestRaisesForAnotherReplicasAgents: eu runs two replicas and its agents
// lease only through the one that does not hold the exchange, so the
// holder's lease service sees none of their grants. Raises of eu's share
// must reach the store all the same: demand moving to eu moves eu's share
// in its store. (A lease service that keeps raises until it sees its key
// short would keep them for good here, unless it writes them all while the
// exchange hears a sibling replica.)
func TestRaisesForAnotherReplicasAgents(t *testing.T) {
	regions := []string{"eu", "us"}
	dep := newDeployment(t, regions...)
	a, b := dep.add("eu", "eu-a"), dep.add("eu", "eu-b")
	dep.add("us", "us-0")
	deadline := time.Now().Add(10 * time.Second)
	for a.Exchanger().Leader() == b.Exchanger().Leader() {
		if time.Now().After(deadline) {
			t.Fatalf("no single holder in eu within 10s: leaders %v and %v", a.Exchanger().Leader(), b.Exchanger().Leader())
		}
		time.Sleep(syncPeriod / 10) // polling interval, not a wait for an event
	}
	holder, other := a, b
	if b.Exchanger().Leader() {
		holder, other = b, a
	}
	dep.nodes["eu"] = []*Daemon{other, holder} // the load goes to the first
	rates := map[string]int64{"eu": 200, "us": 800}
	l := dep.load(rates)
	dep.observe("us takes its share", 10*time.Second, func(sh map[string]int64) bool {
		return within5(sh, targets(regions, rates), regions...)
	})
	rates = map[string]int64{"eu": 800, "us": 200}
	l.set(rates)
	dep.observe("eu takes the share through its other replica", 10*time.Second, func(sh map[string]int64) bool {
		return within5(sh, targets(regions, rates), regions...)
	})
	if !holder.Exchanger().Leader() {
		t.Logf("the holder changed during the test (%s no longer holds): its own grants may have been seen", holder.cfg.Replica)
	}
}
