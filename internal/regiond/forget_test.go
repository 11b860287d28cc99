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
	"github.com/ration-dev/ration/region"
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
	svc, err := service.New(service.Config{Region: "eu", Store: mem, Policy: pol, Clock: clock, InitialShare: 500_000})
	if err != nil {
		t.Fatal(err)
	}
	fx := forgetting{mem, svc, new(atomic.Pointer[exchange.Exchanger])}
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

// TestKeptRaisesAndTheHold: a raise the lease service keeps (the key is not
// short) stays out of the store until the exchange reads the store's
// incarnation after the key ran short; and once this replica takes the
// exchange's hold, or the store's incarnation changes, the service no longer
// trusts what it wrote before and every write reaches the store.
func TestKeptRaisesAndTheHold(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	pol, err := policy.Parse("p.yaml", []byte("rules:\n  - {name: r, key: [k], limit: 10, period: 1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	mem := lease.NewMemoryStore(lease.MemoryConfig{Clock: clock})
	svc, err := service.New(service.Config{Region: "eu", Store: mem, Policy: pol, Clock: clock, InitialShare: 500_000})
	if err != nil {
		t.Fatal(err)
	}
	fx := forgetting{mem, svc, new(atomic.Pointer[exchange.Exchanger])}
	coord := resetting{exchange.NewMemoryCoordinator(clock), svc}
	ctx := context.Background()
	key := policy.StoreKey("r", "k=1")
	limit := service.Limit(pol.Rule("r"), 500_000, now)
	write := func(ppm int64) {
		t.Helper()
		if err := fx.SetShares(ctx, []lease.ShareUpdate{{Key: key, SharePPM: ppm, Limit: limit}}, make([]lease.ShareResult, 1)); err != nil {
			t.Fatal(err)
		}
	}
	stored := func() int64 {
		t.Helper()
		out := make([]int64, 1)
		if err := mem.Shares(ctx, []string{key}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	if _, err := fx.Incarnation(ctx); err != nil {
		t.Fatal(err)
	}
	write(200_000)
	write(800_000) // kept: nobody asked for the key
	if got := stored(); got != 200_000 {
		t.Fatalf("the store holds %d ppm, want the 200,000 written before the kept raise", got)
	}
	// Two tokens at 20%: an ask for 10 finds the key short.
	resp, err := svc.Lease(ctx, &leasev1.LeaseRequest{Agent: &leasev1.Agent{Id: "a"}, Items: []*leasev1.LeaseItem{{Rule: "r", Key: "k=1", Want: 10}}})
	if err != nil {
		t.Fatal(err)
	}
	if g := resp.Grants[0].GetGranted(); g != 2 {
		t.Fatalf("granted %d, want the 2 tokens of a 20%% bucket", g)
	}
	if _, err := fx.Incarnation(ctx); err != nil { // the next epoch
		t.Fatal(err)
	}
	if got := stored(); got != 800_000 {
		t.Fatalf("after the key ran short the store holds %d ppm, want the kept 800,000", got)
	}
	write(100_000)
	write(300_000)
	if got := stored(); got != 300_000 {
		// The key ran short lately: its raises are written at once.
		t.Fatalf("the store holds %d ppm, want 300,000", got)
	}
	// k=2 is not short: its raises are kept while this replica holds the
	// exchange, and written once it takes the hold again after a lapse.
	other := policy.StoreKey("r", "k=2")
	acquire := func(want region.Hold) {
		t.Helper()
		if h, err := coord.Acquire(ctx, "eu", "replica-1", time.Minute); err != nil || h != want {
			t.Fatalf("Acquire: %v, %v; want %v", h, err, want)
		}
	}
	acquire(region.HoldTaken)
	for _, step := range []struct {
		ppm, stored int64
		then        func()
	}{
		{100_000, 100_000, func() { acquire(region.HoldRenewed) }},
		{400_000, 100_000, func() { now = now.Add(2 * time.Minute); acquire(region.HoldTaken) }},
		{400_000, 400_000, func() {}},
	} {
		if err := fx.SetShares(ctx, []lease.ShareUpdate{{Key: other, SharePPM: step.ppm, Limit: limit}}, make([]lease.ShareResult, 1)); err != nil {
			t.Fatal(err)
		}
		out := make([]int64, 1)
		if err := mem.Shares(ctx, []string{other}, out); err != nil {
			t.Fatal(err)
		}
		if out[0] != step.stored {
			t.Fatalf("after writing %d ppm the store holds %d ppm of k=2, want %d", step.ppm, out[0], step.stored)
		}
		step.then()
	}
}

// TestRaisesForAnotherReplicasAgents: eu runs two replicas and its agents
// lease only through the one that does not hold the exchange, so the
// holder's lease service sees none of their grants. Raises of eu's share
// must reach the store all the same (the holder hears its sibling and keeps
// no raise): demand moving to eu moves eu's share in its store.
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
