package regiond

import (
	"context"
	"log/slog"
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
	mem, keeper, svc, pol := keptFixture(t, clock)
	fx := forgetting{mem, svc, keeper, func() bool { return false }, slog.New(slog.DiscardHandler)}
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
// in its store. (A share keeper that keeps raises until its own grants of
// the key carry them would keep them for good here, unless it writes them
// all while the exchange hears a sibling replica.)
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

// TestKeptRaisesAndTheHold: through the daemon's wiring, a raise of a key
// stays out of the store until a grant of the key carries it, short or
// not; every kept raise is written once a sibling replica is heard; and
// once this replica takes the exchange's hold afresh, every write reaches
// the store.
func TestKeptRaisesAndTheHold(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	mem, keeper, svc, pol := keptFixture(t, clock)
	siblings := false
	fx := forgetting{mem, svc, keeper, func() bool { return siblings }, slog.New(slog.DiscardHandler)}
	coord := resetting{exchange.NewMemoryCoordinator(clock), keeper}
	ctx := context.Background()
	limit := service.Limit(pol.Rule("r"), 500_000, now)
	write := func(key string, ppm int64) {
		t.Helper()
		if err := fx.SetShares(ctx, []lease.ShareUpdate{{Key: key, SharePPM: ppm, Limit: limit}}, make([]lease.ShareResult, 1)); err != nil {
			t.Fatal(err)
		}
	}
	stored := func(key string) int64 {
		t.Helper()
		out := make([]int64, 1)
		if err := mem.Shares(ctx, []string{key}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	epoch := func() {
		t.Helper()
		if _, err := fx.Incarnation(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ask := func(k string, want int64) int64 {
		t.Helper()
		resp, err := svc.Lease(ctx, &leasev1.LeaseRequest{Agent: &leasev1.Agent{Id: "a"}, Items: []*leasev1.LeaseItem{{Rule: "r", Key: k, Want: want}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Grants[0].GetGranted()
	}
	key := policy.StoreKey("r", "k=1")
	epoch()
	write(key, 200_000)
	if g := ask("k=1", 1); g != 1 {
		t.Fatalf("granted %d, want 1 from a full bucket", g)
	}
	now = now.Add(11 * time.Second)
	write(key, 800_000)
	if got := stored(key); got != 200_000 {
		t.Fatalf("the store holds %d ppm, want the 200,000 written before the kept raise", got)
	}
	epoch()
	if got := stored(key); got != 200_000 {
		t.Fatalf("after an epoch without a grant the store holds %d ppm, want 200,000", got)
	}
	// Two tokens at 20%, raised as the ask comes: it carries the raise.
	if g := ask("k=1", 10); g != 2 {
		t.Fatalf("granted %d, want the 2 tokens of a 20%% bucket", g)
	}
	if got := stored(key); got != 800_000 {
		t.Fatalf("after a grant the store holds %d ppm, want the kept 800,000 it carried", got)
	}
	write(key, 900_000) // kept again, though the key ran short
	if got := stored(key); got != 800_000 {
		t.Fatalf("the store holds %d ppm, want the 800,000 before the kept raise", got)
	}
	ask("k=1", 1)
	if got := stored(key); got != 900_000 {
		t.Fatalf("after a grant the store holds %d ppm, want the kept 900,000 it carried", got)
	}

	// k=2 has plenty: its raise is kept until a sibling is heard.
	other := policy.StoreKey("r", "k=2")
	write(other, 500_000)
	if g := ask("k=2", 1); g != 1 {
		t.Fatalf("granted %d of k=2, want 1", g)
	}
	now = now.Add(11 * time.Second)
	write(other, 600_000)
	if got := stored(other); got != 500_000 {
		t.Fatalf("the store holds %d ppm of k=2, want the 500,000 before the kept raise", got)
	}
	siblings = true
	epoch()
	if got := stored(other); got != 600_000 {
		t.Fatalf("with a sibling heard the store holds %d ppm of k=2, want the kept 600,000", got)
	}
	write(other, 700_000)
	if got := stored(other); got != 700_000 {
		t.Fatalf("with a sibling heard the store holds %d ppm of k=2, want 700,000", got)
	}

	// Without siblings again, raises are kept; a hold taken afresh forgets
	// everything.
	siblings = false
	acquire := func(want region.Hold) {
		t.Helper()
		if h, err := coord.Acquire(ctx, "eu", "replica-1", time.Minute); err != nil || h != want {
			t.Fatalf("Acquire: %v, %v; want %v", h, err, want)
		}
	}
	acquire(region.HoldTaken)
	epoch()
	now = now.Add(11 * time.Second)
	for _, step := range []struct {
		ppm, stored int64
		then        func()
	}{
		{100_000, 100_000, func() { acquire(region.HoldRenewed) }}, // first write after the take-over
		{500_000, 100_000, func() { now = now.Add(2 * time.Minute); acquire(region.HoldTaken) }},
		{600_000, 600_000, func() {}},
	} {
		write(other, step.ppm)
		if got := stored(other); got != step.stored {
			t.Fatalf("after writing %d ppm the store holds %d ppm of k=2, want %d", step.ppm, got, step.stored)
		}
		step.then()
	}
}

// keptFixture is the daemon's store wiring on a memory store at clock: the
// lease service grants through a share keeper, for one rule r of 10/s.
func keptFixture(t *testing.T, clock func() time.Time) (*lease.MemoryStore, *service.ShareKeeper, *service.Service, *policy.Set) {
	t.Helper()
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
	return mem, keeper, svc, pol
}
