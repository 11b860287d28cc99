package service

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ration-dev/ration/lease"
)

// keeperRig is a ShareKeeper over a memory store on a clock the test moves.
type keeperRig struct {
	t   *testing.T
	now time.Time
	mem *lease.MemoryStore
	k   *ShareKeeper
}

func newKeeperRig(t *testing.T) *keeperRig {
	r := &keeperRig{t: t, now: time.Unix(1_700_000_000, 0)}
	clock := func() time.Time { return r.now }
	r.mem = lease.NewMemoryStore(lease.MemoryConfig{Clock: clock})
	k, err := NewShareKeeper(ShareKeeperConfig{Store: r.mem, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	r.k = k
	return r
}

// userLimit is a per-user key: 5 tokens a second, bursts of 20.
var userLimit = lease.Limit{Rate: 5, Burst: 20, Cost: 1, InitialShare: 333_333}

func (r *keeperRig) set(key string, ppm int64) lease.ShareResult {
	r.t.Helper()
	out := make([]lease.ShareResult, 1)
	if err := r.k.SetShares(context.Background(), r.mem.SetShares, []lease.ShareUpdate{{Key: key, SharePPM: ppm, Limit: userLimit}}, out); err != nil {
		r.t.Fatal(err)
	}
	return out[0]
}

func (r *keeperRig) grant(key string, want int64) lease.Grant {
	r.t.Helper()
	out := make([]lease.Grant, 1)
	if err := r.k.Grant(context.Background(), []lease.GrantRequest{{Key: key, Want: want, Limit: userLimit}}, out); err != nil {
		r.t.Fatal(err)
	}
	return out[0]
}

func (r *keeperRig) flush() {
	r.t.Helper()
	if err := r.k.Flush(context.Background(), r.mem.SetShares); err != nil {
		r.t.Fatal(err)
	}
}

func (r *keeperRig) stored(key string) int64 {
	r.t.Helper()
	out := []int64{0}
	if err := r.mem.Shares(context.Background(), []string{key}, out); err != nil {
		r.t.Fatal(err)
	}
	return out[0]
}

func (r *keeperRig) wantStored(key string, want int64) {
	r.t.Helper()
	if got := r.stored(key); got != want {
		r.t.Fatalf("store's share of %s: got %d, want %d (counts %+v)", key, got, want, r.k.Counts())
	}
}

// TestShareKeeperCarriesRaises: a raise of a key whose store share the
// keeper knows is kept, whether the key runs short or not, and the key's
// next grant carries it: the grant gets what it would have got had the raise
// been written when it was made (a reference store where it was), for a
// key of a few tokens a second and one of a few tokens in ten minutes, in
// one step and in several; a lowering below the store's share or a kept
// raise is written at once, after the kept steps.
func TestShareKeeperCarriesRaises(t *testing.T) {
	slow := lease.Limit{Rate: 0.01, Burst: 10, Cost: 1, InitialShare: 333_333}
	for _, l := range []lease.Limit{userLimit, slow} {
		r := newKeeperRig(t)
		ref := lease.NewMemoryStore(lease.MemoryConfig{Clock: func() time.Time { return r.now }})
		set := func(key string, ppm int64) {
			t.Helper()
			ups := []lease.ShareUpdate{{Key: key, SharePPM: ppm, Limit: l}}
			out := make([]lease.ShareResult, 1)
			if err := r.k.SetShares(context.Background(), r.mem.SetShares, ups, out); err != nil {
				t.Fatal(err)
			}
			if r.stored(key) != ppm && out[0] != (lease.ShareResult{}) {
				t.Fatalf("a kept raise's result: got %+v, want zero", out[0])
			}
			if err := ref.SetShares(context.Background(), ups, make([]lease.ShareResult, 1)); err != nil {
				t.Fatal(err)
			}
		}
		grant := func(key string, want int64) {
			t.Helper()
			reqs := []lease.GrantRequest{{Key: key, Want: want, Limit: l}}
			got, ref1 := make([]lease.Grant, 1), make([]lease.Grant, 1)
			if err := r.k.Grant(context.Background(), reqs, got); err != nil {
				t.Fatal(err)
			}
			if err := ref.Grant(context.Background(), reqs, ref1); err != nil {
				t.Fatal(err)
			}
			if got[0].Granted != ref1[0].Granted || got[0].SharePPM != ref1[0].SharePPM || math.Abs(got[0].Tokens-ref1[0].Tokens) > 1e-9 {
				t.Fatalf("rate %v: grant of %s: got %+v, written at once %+v", l.Rate, key, got[0], ref1[0])
			}
		}
		set("k", 300_000) // the store's share is not known yet: written
		r.wantStored("k", 300_000)
		grant("k", 100)
		r.now = r.now.Add(time.Second)
		set("k", 400_000) // kept, though the key is short
		r.wantStored("k", 300_000)
		r.flush()
		r.wantStored("k", 300_000)
		r.now = r.now.Add(2 * time.Second)
		grant("k", 100) // carries it
		r.wantStored("k", 400_000)
		for i, ppm := range []int64{500_000, 500_000, 700_000, 900_000} {
			r.now = r.now.Add(time.Duration(i+1) * time.Second)
			set("k", ppm)
		}
		r.wantStored("k", 400_000)
		r.now = r.now.Add(time.Second)
		grant("k", 100) // four steps
		r.wantStored("k", 900_000)
		set("k", 950_000)
		r.now = r.now.Add(3 * time.Second)
		set("k", 600_000) // below the kept raise: written after its step
		r.wantStored("k", 600_000)
		r.now = r.now.Add(time.Second)
		grant("k", 100)
		set("k", 350_000) // below the store's share: written
		r.wantStored("k", 350_000)
		want := ShareCounts{Unknown: 1, Lowered: 2, Kept: 6, Carried: 2}
		if got := r.k.Counts(); got != want {
			t.Fatalf("counts: got %+v, want %+v", got, want)
		}
	}
}

// TestShareKeeperWritesWhatItMust: the raises the keeper writes at once.
func TestShareKeeperWritesWhatItMust(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before runs after the first write, with the clock 11 s later.
		before func(r *keeperRig)
	}{
		{"another replica's agents", func(r *keeperRig) { r.k.KeepRaises(false) }},
		{"reset (a take-over)", func(r *keeperRig) {
			r.k.Reset()
			r.now = r.now.Add(11 * time.Second)
		}},
		{"a new store incarnation", func(r *keeperRig) {
			r.k.SawIncarnation("a")
			r.k.SawIncarnation("b")
		}},
		{"written over MaxKeep ago", func(r *keeperRig) { r.now = r.now.Add(time.Hour) }},
		{"share deleted", func(r *keeperRig) { r.k.Forget("k") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newKeeperRig(t)
			r.set("k", 300_000)
			r.now = r.now.Add(11 * time.Second)
			tc.before(r)
			r.set("k", 400_000)
			r.wantStored("k", 400_000)
		})
	}
	t.Run("control: kept", func(t *testing.T) {
		r := newKeeperRig(t)
		r.set("k", 300_000)
		r.now = r.now.Add(11 * time.Second)
		r.set("k", 400_000)
		r.wantStored("k", 300_000)
	})
	t.Run("control: kept after a short grant", func(t *testing.T) {
		r := newKeeperRig(t)
		r.set("k", 300_000)
		r.grant("k", 100)
		r.set("k", 400_000)
		r.wantStored("k", 300_000)
	})
}

// TestShareKeeperKeepRaisesOff: kept raises are written at the next flush
// once raises may no longer be kept.
func TestShareKeeperKeepRaisesOff(t *testing.T) {
	r := newKeeperRig(t)
	r.set("k", 300_000)
	r.now = r.now.Add(11 * time.Second)
	r.set("k", 400_000)
	r.wantStored("k", 300_000)
	r.k.KeepRaises(false)
	r.flush()
	r.wantStored("k", 400_000)
	r.k.KeepRaises(true)
	r.set("k", 500_000)
	r.wantStored("k", 400_000) // kept again
	r.grant("k", 1)
	r.wantStored("k", 500_000)
}

// TestShareKeeperNeverAboveExchange: whatever the order of share updates,
// grants, flushes, resets, failed writes and deletions, no grant sees a
// larger share than the exchange's latest update of its key, nor does the
// store hold one for a key without a deferred update, and a grant leaves the
// store at the exchange's share unless a raise is still kept or a failed
// write left the store's share in doubt.
func TestShareKeeperNeverAboveExchange(t *testing.T) {
	seed, err := strconv.ParseUint(os.Getenv("RATION_SEED"), 10, 64)
	if err != nil || seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: RATION_SEED=%d go test ./lease/service -run '%s')", seed, seed, t.Name())
	rng := rand.New(rand.NewPCG(seed, 2))
	r := newKeeperRig(t)
	// The keeper writes deferred updates itself; one write in ten fails,
	// before or after the store applied it.
	k, err := NewShareKeeper(ShareKeeperConfig{Store: r.mem, Clock: func() time.Time { return r.now },
		Write: func(ctx context.Context, ups []lease.ShareUpdate, out []lease.ShareResult) error {
			if rng.IntN(10) > 0 {
				return r.mem.SetShares(ctx, ups, out)
			}
			if rng.IntN(2) == 0 {
				_ = r.mem.SetShares(ctx, ups, out)
			}
			return errors.New("timed out")
		}})
	if err != nil {
		t.Fatal(err)
	}
	r.k = k
	keys := []string{"a", "b", "c", "d"}
	latest := map[string]int64{}
	// inForce is the share the store applies to key: its stored share, or
	// the initial share while it holds none.
	inForce := func(key string) int64 {
		if s := r.stored(key); s >= 0 {
			return s
		}
		return userLimit.InitialShare
	}
	for step := range 5000 {
		key := keys[rng.IntN(len(keys))]
		switch op := rng.IntN(12); {
		case op < 4:
			ppm := rng.Int64N(1_000_001)
			if rng.IntN(3) == 0 {
				ppm = userLimit.InitialShare // as when a key enters a generation
			}
			r.set(key, ppm)
			latest[key] = ppm
		case op == 10:
			// A write that fails, before or after the store applied it:
			// the exchange's share stays what it was, not known to be the
			// store's, and it writes it again (the region's Resync). (The
			// keeper may also keep the update: then nothing fails.)
			want, ok := latest[key]
			if !ok {
				continue
			}
			ppm := rng.Int64N(1_000_001)
			applied := rng.IntN(2) == 0
			write := func(ctx context.Context, ups []lease.ShareUpdate, out []lease.ShareResult) error {
				if applied {
					if err := r.mem.SetShares(ctx, ups, out); err != nil {
						return err
					}
				}
				return errors.New("timed out")
			}
			if err := r.k.SetShares(context.Background(), write, []lease.ShareUpdate{{Key: key, SharePPM: ppm, Limit: userLimit}}, make([]lease.ShareResult, 1)); err == nil {
				latest[key] = ppm // kept
				continue
			}
			r.set(key, want)
		case op == 11:
			// The key retires: its share is deleted, and the store applies
			// the initial share.
			if err := r.k.Retiring(context.Background(), []string{key}); err != nil {
				t.Fatal(err)
			}
			if err := r.mem.DeleteShares(context.Background(), []string{key}); err != nil {
				t.Fatal(err)
			}
			r.k.Forget(key)
			latest[key] = userLimit.InitialShare
		case op < 7:
			out := make([]lease.Grant, 1)
			if err := r.k.Grant(context.Background(), []lease.GrantRequest{{Key: key, Want: 1 + rng.Int64N(8), Limit: userLimit}}, out); err != nil {
				continue // a deferred update's write failed: nothing granted
			}
			g := out[0]
			if g.Err != nil {
				t.Fatalf("step %d: grant: %v", step, g.Err)
			}
			if want, ok := latest[key]; ok && g.SharePPM > want {
				t.Fatalf("step %d: %s granted at share %d above the exchange's %d", step, key, g.SharePPM, want)
			}
			// A grant carries what the keeper kept: the store is then at
			// the exchange's share, unless the keeper keeps a raise (a
			// capped grant found less) or a failed write left it unknown.
			_, kept := r.k.pending[key]
			if want, ok := latest[key]; ok && !kept && r.k.doubt[key] == 0 && g.SharePPM != want {
				t.Fatalf("step %d: %s granted at share %d, not the exchange's %d", step, key, g.SharePPM, want)
			}
		case op < 9:
			r.now = r.now.Add(time.Duration(rng.Int64N(int64(15 * time.Second))))
		default:
			// A take-over: the exchange writes every share again.
			r.k.Reset()
			for _, k := range keys {
				if ppm, ok := latest[k]; ok {
					r.set(k, ppm)
				}
			}
		}
		for _, k := range keys {
			// A deferred update's key may hold more until its next grant
			// (deferred.go): the grants above check it.
			if _, deferred := r.k.deferred[k]; deferred {
				continue
			}
			if want, ok := latest[k]; ok {
				if got := inForce(k); got > want {
					t.Fatalf("step %d: store's share of %s %d above the exchange's %d", step, k, got, want)
				}
			}
		}
	}
	c := r.k.Counts()
	t.Logf("counts %+v", c)
	if c.Kept == 0 || c.Carried == 0 || c.Same == 0 || c.Capped == 0 {
		t.Fatalf("nothing kept, carried, dropped or capped (%+v): the test checks nothing", c)
	}
}

// TestShareKeeperFlushBatch: a flush writes at most FlushBatch kept raises;
// the rest are written by the next.
func TestShareKeeperFlushBatch(t *testing.T) {
	r := newKeeperRig(t)
	k, err := NewShareKeeper(ShareKeeperConfig{Store: r.mem, Clock: func() time.Time { return r.now }, FlushBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	r.k = k
	keys := []string{"a", "b", "c"}
	for _, key := range keys {
		r.set(key, 300_000)
	}
	r.now = r.now.Add(11 * time.Second)
	for _, key := range keys {
		r.set(key, 400_000) // kept
	}
	r.k.KeepRaises(false)
	count := func() (n int) {
		for _, key := range keys {
			if r.stored(key) == 400_000 {
				n++
			}
		}
		return n
	}
	r.flush()
	if got := count(); got != 2 {
		t.Fatalf("after one flush %d raises written, want 2", got)
	}
	r.flush()
	if got := count(); got != 3 {
		t.Fatalf("after two flushes %d raises written, want 3", got)
	}
}

// TestShareKeeperInitialSeenByGrant: an update that sets the initial share,
// with no tokens, of a key a grant found at the initial share is not
// written; anything that may have changed the store's share since the grant
// (a write of the key, even a failed one, a grant overlapping a write, a
// Forget, a Reset) makes it written, as do tokens, another share and a
// fixed window.
func TestShareKeeperInitialSeenByGrant(t *testing.T) {
	initial := userLimit.InitialShare
	writes := 0
	counting := func(r *keeperRig) ShareWrite {
		return func(ctx context.Context, ups []lease.ShareUpdate, out []lease.ShareResult) error {
			writes += len(ups)
			return r.mem.SetShares(ctx, ups, out)
		}
	}
	update := func(r *keeperRig, u lease.ShareUpdate) {
		t.Helper()
		if u.Limit == (lease.Limit{}) {
			u.Limit = userLimit
		}
		if err := r.k.SetShares(context.Background(), counting(r), []lease.ShareUpdate{u}, make([]lease.ShareResult, 1)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name    string
		between func(r *keeperRig) // after the grant, before the update
		u       lease.ShareUpdate
		written bool
	}{
		{"control: same", nil, lease.ShareUpdate{SharePPM: initial}, false},
		{"tokens received", nil, lease.ShareUpdate{SharePPM: initial, Gen: 1, Received: 5}, true},
		{"another share", nil, lease.ShareUpdate{SharePPM: initial - 1}, true},
		{"written since", func(r *keeperRig) { update(r, lease.ShareUpdate{Key: "k", SharePPM: 600_000}) }, lease.ShareUpdate{SharePPM: initial}, true},
		{"a failed write since", func(r *keeperRig) {
			fail := func(ctx context.Context, ups []lease.ShareUpdate, out []lease.ShareResult) error {
				_ = r.mem.SetShares(ctx, ups, out) // applied, then timed out
				return errors.New("timed out")
			}
			if err := r.k.SetShares(context.Background(), fail, []lease.ShareUpdate{{Key: "k", SharePPM: 600_000, Limit: userLimit}}, make([]lease.ShareResult, 1)); err == nil {
				t.Fatal("a failing write reported no error")
			}
		}, lease.ShareUpdate{SharePPM: initial}, true},
		{"forgotten", func(r *keeperRig) { r.k.Forget("k") }, lease.ShareUpdate{SharePPM: initial}, true},
		{"reset", func(r *keeperRig) { r.k.Reset() }, lease.ShareUpdate{SharePPM: initial}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newKeeperRig(t)
			r.grant("k", 1)
			if tc.between != nil {
				tc.between(r)
			}
			writes = 0
			tc.u.Key = "k"
			update(r, tc.u)
			if got := writes == 1; got != tc.written {
				t.Fatalf("written %v, want %v (counts %+v)", got, tc.written, r.k.Counts())
			}
			if !tc.written {
				r.wantStored("k", -1) // none: the store applies the initial share
				if c := r.k.Counts(); c.Same != 1 || c.Written() != 0 {
					t.Fatalf("counts %+v, want one Same and nothing written", c)
				}
			}
		})
	}
	t.Run("a grant overlapping a write", func(t *testing.T) {
		r := newKeeperRig(t)
		// The grant runs while a write of another key is under way: what
		// it found may predate that write, so it is not noted.
		during := func(ctx context.Context, ups []lease.ShareUpdate, out []lease.ShareResult) error {
			r.grant("k", 1)
			return r.mem.SetShares(ctx, ups, out)
		}
		if err := r.k.SetShares(context.Background(), during, []lease.ShareUpdate{{Key: "other", SharePPM: 100_000, Limit: userLimit}}, make([]lease.ShareResult, 1)); err != nil {
			t.Fatal(err)
		}
		writes = 0
		update(r, lease.ShareUpdate{Key: "k", SharePPM: initial})
		if writes != 1 {
			t.Fatalf("the update was not written (counts %+v)", r.k.Counts())
		}
	})
	t.Run("a fixed window", func(t *testing.T) {
		r := newKeeperRig(t)
		w := lease.Limit{Rate: 100.0 / 60, Burst: 100, Cost: 1, InitialShare: initial}
		start := r.now.Truncate(time.Minute)
		w.Window = [4]int64{start.Add(-time.Minute).UnixMicro(), start.UnixMicro(), start.Add(time.Minute).UnixMicro(), start.Add(2 * time.Minute).UnixMicro()}
		if err := r.k.Grant(context.Background(), []lease.GrantRequest{{Key: "k", Want: 1, Limit: w}}, make([]lease.Grant, 1)); err != nil {
			t.Fatal(err)
		}
		writes = 0
		update(r, lease.ShareUpdate{Key: "k", SharePPM: initial, Limit: w, Window: start.UnixMicro()})
		if writes != 1 {
			t.Fatalf("a fixed window's update was not written (counts %+v)", r.k.Counts())
		}
	})
}

// TestShareKeeperDefers: with a Write, an update of a key whose store share
// is not known and that lowers nothing below the initial share waits for the
// key's next grant or return, which writes it first; one that lowers below
// the initial share is written at once; an exchange write of the key
// replaces a deferred one; one with tokens is carried by the grant as a
// raise; a failed grant leaves it deferred.
func TestShareKeeperDefers(t *testing.T) {
	r := newKeeperRig(t)
	fail := false
	store := &flakyStore{Store: r.mem, fail: &fail}
	k, err := NewShareKeeper(ShareKeeperConfig{Store: store, Clock: func() time.Time { return r.now },
		Write: func(ctx context.Context, ups []lease.ShareUpdate, out []lease.ShareResult) error {
			if fail {
				return errors.New("timed out")
			}
			return r.mem.SetShares(ctx, ups, out)
		}})
	if err != nil {
		t.Fatal(err)
	}
	r.k = k
	r.set("up", 600_000)
	r.set("same", userLimit.InitialShare)
	r.set("down", 200_000)
	r.wantStored("up", -1)
	r.wantStored("same", -1)
	r.wantStored("down", 200_000) // below the initial share: written at once
	r.grant("up", 1)              // no tokens: capped at the grant, the store holding less (a kept raise)
	r.wantStored("up", -1)
	if _, ok := r.k.pending["up"]; !ok {
		t.Fatal("up's raise is not kept")
	}
	if err := r.k.Return(context.Background(), []lease.ReturnRequest{{Key: "same", Tokens: 1, Limit: userLimit}}); err != nil {
		t.Fatal(err)
	}
	r.wantStored("same", userLimit.InitialShare)
	if c := r.k.Counts(); c.Deferred != 2 || c.Settled != 1 || c.Capped != 1 || c.Unknown != 1 {
		t.Fatalf("counts %+v, want 2 deferred, 1 settled, 1 capped, 1 unknown", c)
	}

	r.set("x", 700_000)
	r.set("x", 300_000) // the exchange's newer update: below initial, written
	r.wantStored("x", 300_000)
	r.grant("x", 1)
	r.wantStored("x", 300_000) // the deferred 700,000 is gone

	// With tokens: carried by the grant, which credits them.
	if err := r.k.SetShares(context.Background(), r.mem.SetShares, []lease.ShareUpdate{{Key: "y", SharePPM: 800_000, Limit: userLimit, Gen: 1, Received: 1000}}, make([]lease.ShareResult, 1)); err != nil {
		t.Fatal(err)
	}
	fail = true
	if err := r.k.Grant(context.Background(), []lease.GrantRequest{{Key: "y", Want: 1, Limit: userLimit}}, make([]lease.Grant, 1)); err == nil {
		t.Fatal("a failing store's grant succeeded")
	}
	fail = false
	r.wantStored("y", -1)
	if _, ok := r.k.deferred["y"]; !ok {
		t.Fatal("y's update is no longer deferred after a failed grant")
	}
	// A new bucket at the initial share (6.67 tokens), raised, and 1 received.
	if g := r.grant("y", 100); g.SharePPM != 800_000 || g.Granted != 7 || math.Abs(g.Tokens-2.0/3) > 1e-3 {
		t.Fatalf("carried grant of y: %+v, want 7 granted at share 800000, 0.67 left", g)
	}
	r.wantStored("y", 800_000)

	r.set("z", 900_000)
	r.k.Forget("z") // the key retired: nothing to write
	r.grant("z", 1)
	r.wantStored("z", -1)

	// Another replica's agents would not wait: what was deferred is
	// written at the next flush, and nothing more is deferred.
	r.set("w", 700_000)
	r.k.KeepRaises(false)
	r.flush()
	r.wantStored("w", 700_000)
	r.set("v", 600_000)
	r.wantStored("v", 600_000)
}

// flakyStore is a Store whose grants fail while *fail, and block until
// release is closed when it is not nil (after closing started).
type flakyStore struct {
	Store
	fail             *bool
	started, release chan struct{}
}

func (f *flakyStore) Grant(ctx context.Context, reqs []lease.GrantRequest, out []lease.Grant) error {
	if f.release != nil {
		close(f.started)
		<-f.release
	}
	if f.fail != nil && *f.fail {
		return errors.New("timed out")
	}
	return f.Store.Grant(ctx, reqs, out)
}

// TestShareKeeperSettleOrder: an exchange write of a key whose deferred
// update a return is writing, or whose kept raise a grant carries, waits
// for it to land, so that the store ends at the exchange's share.
func TestShareKeeperSettleOrder(t *testing.T) {
	t.Run("settled by a return", func(t *testing.T) {
		r := newKeeperRig(t)
		started, release := make(chan struct{}), make(chan struct{})
		k, err := NewShareKeeper(ShareKeeperConfig{Store: r.mem, Clock: func() time.Time { return r.now },
			Write: func(ctx context.Context, ups []lease.ShareUpdate, out []lease.ShareResult) error {
				close(started)
				<-release
				return r.mem.SetShares(ctx, ups, out)
			}})
		if err != nil {
			t.Fatal(err)
		}
		r.k = k
		r.set("k", 900_000) // deferred
		returned := make(chan error, 1)
		go func() {
			returned <- k.Return(context.Background(), []lease.ReturnRequest{{Key: "k", Tokens: 1, Limit: userLimit}})
		}()
		<-started
		exchanged := make(chan error, 1)
		go func() {
			exchanged <- k.SetShares(context.Background(), r.mem.SetShares, []lease.ShareUpdate{{Key: "k", SharePPM: 100_000, Limit: userLimit}}, make([]lease.ShareResult, 1))
		}()
		close(release)
		if err := <-returned; err != nil {
			t.Fatal(err)
		}
		if err := <-exchanged; err != nil {
			t.Fatal(err)
		}
		r.wantStored("k", 100_000)
	})
	t.Run("carried by a grant", func(t *testing.T) {
		r := newKeeperRig(t)
		store := &flakyStore{Store: r.mem}
		k, err := NewShareKeeper(ShareKeeperConfig{Store: store, Clock: func() time.Time { return r.now }})
		if err != nil {
			t.Fatal(err)
		}
		r.k = k
		r.set("k", 300_000) // written
		r.set("k", 900_000) // kept
		store.started, store.release = make(chan struct{}), make(chan struct{})
		granted := make(chan error, 1)
		go func() {
			granted <- k.Grant(context.Background(), []lease.GrantRequest{{Key: "k", Want: 1, Limit: userLimit}}, make([]lease.Grant, 1))
		}()
		<-store.started
		exchanged := make(chan error, 1)
		go func() {
			exchanged <- k.SetShares(context.Background(), r.mem.SetShares, []lease.ShareUpdate{{Key: "k", SharePPM: 100_000, Limit: userLimit}}, make([]lease.ShareResult, 1))
		}()
		close(store.release)
		if err := <-granted; err != nil {
			t.Fatal(err)
		}
		if err := <-exchanged; err != nil {
			t.Fatal(err)
		}
		r.wantStored("k", 100_000)
	})
}

// TestShareKeeperCapsAtGrant: a deferred update without tokens is not
// written; the key's next grant caps the share at it (MaxShare), which
// lowers a larger stored share and leaves a smaller one or none, a kept
// raise when smaller.
func TestShareKeeperCapsAtGrant(t *testing.T) {
	r := newKeeperRig(t)
	writes := 0
	k, err := NewShareKeeper(ShareKeeperConfig{Store: r.mem, Clock: func() time.Time { return r.now },
		Write: func(ctx context.Context, ups []lease.ShareUpdate, out []lease.ShareResult) error {
			writes += len(ups)
			return r.mem.SetShares(ctx, ups, out)
		}})
	if err != nil {
		t.Fatal(err)
	}
	r.k = k
	// A share of an earlier process, unknown to the keeper.
	if err := r.mem.SetShares(context.Background(), []lease.ShareUpdate{{Key: "stale", SharePPM: 950_000, Limit: userLimit}, {Key: "low", SharePPM: 400_000, Limit: userLimit}}, make([]lease.ShareResult, 2)); err != nil {
		t.Fatal(err)
	}
	r.set("stale", 900_000)
	r.set("low", 700_000)
	r.set("none", userLimit.InitialShare)
	if g := r.grant("stale", 1); g.SharePPM != 900_000 {
		t.Fatalf("grant of stale at share %d, want 900000", g.SharePPM)
	}
	r.wantStored("stale", 900_000)
	if g := r.grant("low", 1); g.SharePPM != 400_000 {
		t.Fatalf("grant of low at share %d, want 400000", g.SharePPM)
	}
	r.wantStored("low", 400_000)
	r.grant("none", 1)
	r.wantStored("none", -1)
	if c := r.k.Counts(); writes != 0 || c.Capped != 3 || c.Deferred != 3 {
		t.Fatalf("%d writes, counts %+v: want none written, 3 deferred and capped", writes, c)
	}
	if _, ok := r.k.pending["low"]; !ok {
		t.Fatal("low's raise is not kept")
	}
}

// TestShareKeeperShareZero: a region joining with an initial share of 0
// (region.Config.Initial) gets updates of 0 ppm. One for a key whose store
// share the keeper does not know cannot wait for the key's grant as a cap
// (MaxShare 0 caps nothing): it is written at once, so that the grant is
// made at 0 and not at a share an earlier process left, and nothing of
// the key is left settling.
func TestShareKeeperShareZero(t *testing.T) {
	r := newKeeperRig(t)
	k, err := NewShareKeeper(ShareKeeperConfig{Store: r.mem, Clock: func() time.Time { return r.now }, Write: r.mem.SetShares})
	if err != nil {
		t.Fatal(err)
	}
	r.k = k
	joining := userLimit
	joining.InitialShare = 0
	ctx := context.Background()
	// A share an earlier process left, unknown to the keeper.
	if err := r.mem.SetShares(ctx, []lease.ShareUpdate{{Key: "k", SharePPM: 600_000, Limit: joining}}, make([]lease.ShareResult, 1)); err != nil {
		t.Fatal(err)
	}
	if err := k.SetShares(ctx, r.mem.SetShares, []lease.ShareUpdate{{Key: "k", SharePPM: 0, Limit: joining}}, make([]lease.ShareResult, 1)); err != nil {
		t.Fatal(err)
	}
	out := make([]lease.Grant, 1)
	if err := k.Grant(ctx, []lease.GrantRequest{{Key: "k", Want: 1, Limit: joining}}, out); err != nil {
		t.Fatal(err)
	}
	// At share 0 the bucket holds one cost at most (a capacity never falls
	// below one).
	if out[0].SharePPM != 0 || out[0].Granted > 1 {
		t.Fatalf("grant at share %d granted %d: want share 0, at most one cost", out[0].SharePPM, out[0].Granted)
	}
	// The key's next update does not wait on anything.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := k.SetShares(wctx, r.mem.SetShares, []lease.ShareUpdate{{Key: "k", SharePPM: 1_000, Limit: joining}}, make([]lease.ShareResult, 1)); err != nil {
		t.Fatalf("the next update of the key: %v", err)
	}
}
