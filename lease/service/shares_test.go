package service

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ration-dev/ration/lease"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// shareFixture is a service on a memory store with the exchange's share
// writes going through WriteShares, as regiond and the simulator write them.
type shareFixture struct {
	*fixture
	store *lease.MemoryStore
}

func startShares(t *testing.T) *shareFixture {
	t.Helper()
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	store := lease.NewMemoryStore(lease.MemoryConfig{Clock: clk.Now})
	f := start(t, Config{Store: store, Clock: clk.Now, InitialShare: 500_000})
	return &shareFixture{f, store}
}

func (f *shareFixture) write(t *testing.T, key string, ppm int64) lease.ShareResult {
	t.Helper()
	l := Limit(f.svc.Policy().Rule("per-tenant"), 500_000, f.clock.Now())
	out := make([]lease.ShareResult, 1)
	if err := f.svc.WriteShares(context.Background(), f.store.SetShares, []lease.ShareUpdate{{Key: key, SharePPM: ppm, Limit: l}}, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func (f *shareFixture) stored(t *testing.T, key string) int64 {
	t.Helper()
	out := make([]int64, 1)
	if err := f.store.Shares(context.Background(), []string{key}, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// TestShareRaisesWaitForNeed: the first write of a key reaches the store; a
// raise of a key that is not short is kept, and so is a lowering that does
// not go below what the store holds; a lowering below it is written. Once a
// grant finds the key short its kept raise is written before the next epoch
// (FlushShares), and its raises are written at once after.
func TestShareRaisesWaitForNeed(t *testing.T) {
	f := startShares(t)
	acme, other := policy.StoreKey("per-tenant", "tenant=acme"), policy.StoreKey("per-tenant", "tenant=other")
	steps := []struct {
		ppm, stored, written int64
	}{
		{400_000, 400_000, 1}, // first write: the store's share is not known
		{700_000, 400_000, 1}, // a raise: kept
		{500_000, 400_000, 1}, // lowered, still above the store's
		{300_000, 300_000, 2}, // below it: written
		{600_000, 300_000, 2},
	}
	for i, s := range steps {
		f.write(t, acme, s.ppm)
		written := f.svc.ShareCounts().Written()
		if got := f.stored(t, acme); got != s.stored || written != s.written {
			t.Fatalf("step %d (%d ppm): store holds %d ppm after %d writes, want %d after %d", i, s.ppm, got, written, s.stored, s.written)
		}
	}
	f.write(t, other, 400_000)
	if got := f.stored(t, acme); got != 300_000 {
		t.Fatalf("a write of another key wrote acme's kept raise (%d ppm) before acme ran short", got)
	}
	// The bucket holds 200 × 0.3 = 60: an ask for 100 finds it short.
	if g := f.lease(t, &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 100, Demand: 100}).Grants[0].GetGranted(); g != 60 {
		t.Fatalf("granted %d, want the 60 of a 30%% bucket", g)
	}
	if err := f.svc.FlushShares(context.Background(), f.store.SetShares); err != nil { // before the next epoch
		t.Fatal(err)
	}
	if got := f.stored(t, acme); got != 600_000 {
		t.Fatalf("after acme ran short the flush left its share at %d ppm, want 600,000", got)
	}
	f.write(t, acme, 650_000)
	if got := f.stored(t, acme); got != 650_000 {
		t.Fatalf("a raise of a key short lately was kept: store holds %d ppm, want 650,000", got)
	}
}

// TestSharesForgottenOnReset: after ResetShares, a new incarnation or
// Forget, the next write reaches the store whatever it is.
func TestSharesForgottenOnReset(t *testing.T) {
	f := startShares(t)
	key := policy.StoreKey("per-tenant", "tenant=acme")
	f.svc.SawIncarnation("run-1")
	for i, reset := range []func(){
		f.svc.ResetShares,
		func() { f.svc.SawIncarnation("run-2") },
		func() { f.svc.Forget(key) },
	} {
		f.write(t, key, 100_000)
		f.write(t, key, 200_000) // kept
		if got := f.stored(t, key); got != 100_000 {
			t.Fatalf("case %d: a raise reached the store (%d ppm)", i, got)
		}
		reset()
		f.write(t, key, 200_000)
		if got := f.stored(t, key); got != 200_000 {
			t.Fatalf("case %d: after the reset the write was kept (store holds %d ppm)", i, got)
		}
	}
	f.svc.SawIncarnation("run-2") // the same incarnation forgets nothing
	f.write(t, key, 300_000)
	if got := f.stored(t, key); got != 200_000 {
		t.Fatalf("the same incarnation reset the shares: store holds %d ppm", got)
	}
}

// TestKeepRaisesOff: while raises may not be kept (another replica of the
// region may serve agents whose grants this service never sees), every
// raise is written at once, and the first flush writes the raises kept
// before.
func TestKeepRaisesOff(t *testing.T) {
	f := startShares(t)
	acme, other := policy.StoreKey("per-tenant", "tenant=acme"), policy.StoreKey("per-tenant", "tenant=other")
	f.write(t, acme, 300_000)
	f.write(t, acme, 600_000) // kept
	if got := f.stored(t, acme); got != 300_000 {
		t.Fatalf("a raise reached the store (%d ppm) while raises may be kept", got)
	}
	f.svc.KeepRaises(false)
	if err := f.svc.FlushShares(context.Background(), f.store.SetShares); err != nil {
		t.Fatal(err)
	}
	if got := f.stored(t, acme); got != 600_000 {
		t.Fatalf("the flush after KeepRaises(false) left acme at %d ppm, want its kept 600,000", got)
	}
	f.write(t, other, 300_000)
	f.write(t, other, 700_000)
	if got := f.stored(t, other); got != 700_000 {
		t.Fatalf("with raises not kept, a raise was kept: store holds %d ppm, want 700,000", got)
	}
	f.svc.KeepRaises(true)
	f.write(t, other, 800_000)
	if got := f.stored(t, other); got != 700_000 {
		t.Fatalf("raises may be kept again, yet the raise was written (%d ppm)", got)
	}
}

// TestStoredShareNeverAboveApplied runs random share writes, asks and
// resets, and requires that the share the store holds is never above the
// share the exchange last wrote for the key: the bound's premise.
func TestStoredShareNeverAboveApplied(t *testing.T) {
	seed, err := strconv.ParseUint(os.Getenv("RATION_SEED"), 10, 64)
	if err != nil || seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: RATION_SEED=%d go test ./lease/service -run %s)", seed, seed, t.Name())
	rng := rand.New(rand.NewPCG(seed, 0))
	f := startShares(t)
	tenants := []string{"a", "b", "c", "d"}
	applied := map[string]int64{}
	for step := range 2000 {
		tenant := tenants[rng.IntN(len(tenants))]
		key := policy.StoreKey("per-tenant", "tenant="+tenant)
		switch r := rng.IntN(10); {
		case r < 5:
			ppm := rng.Int64N(1_000_001)
			f.write(t, key, ppm)
			applied[key] = ppm
		case r < 8:
			f.lease(t, &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=" + tenant, Want: 1 + rng.Int64N(100), Demand: 1})
		case r < 9:
			f.clock.Advance(time.Duration(rng.Int64N(int64(2 * time.Second))))
		default:
			f.svc.ResetShares()
		}
		for k, want := range applied {
			if got := f.stored(t, k); got > want {
				t.Fatalf("step %d: the store holds %d ppm of %s, above the %d the exchange applied", step, got, k, want)
			}
		}
	}
}
