package service

import (
	"context"
	"errors"
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

// TestShareKeeperKeepsRaisesOfFullBuckets: a raise of a key whose grants
// found plenty is kept, written at the next flush once a grant finds the key
// short, and a lowering below the store's share is written at once.
func TestShareKeeperKeepsRaisesOfFullBuckets(t *testing.T) {
	r := newKeeperRig(t)
	r.set("k", 300_000) // the store's share is not known yet: written
	r.wantStored("k", 300_000)
	r.grant("k", 1) // a full bucket: plenty
	r.now = r.now.Add(11 * time.Second)
	if res := r.set("k", 400_000); res != (lease.ShareResult{}) {
		t.Fatalf("a kept raise's result: got %+v, want zero", res)
	}
	r.wantStored("k", 300_000)
	r.flush()
	r.wantStored("k", 300_000) // not short: still kept
	if g := r.grant("k", 100); g.Granted == 100 {
		t.Fatalf("granted %d of 100 from a bucket of 6", g.Granted)
	}
	r.flush()
	r.wantStored("k", 400_000)
	res := r.set("k", 350_000) // below the store's share: written
	r.wantStored("k", 350_000)
	if res.Tokens < 0 {
		t.Fatalf("a lowering's result: %+v", res)
	}
	want := ShareCounts{Unknown: 1, Lowered: 1, Flushed: 1, Kept: 1}
	if got := r.k.Counts(); got != want {
		t.Fatalf("counts: got %+v, want %+v", got, want)
	}
}

// TestShareKeeperWritesWhatItMust: the raises the keeper writes at once.
func TestShareKeeperWritesWhatItMust(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before runs after the first write, with the clock 11 s later.
		before func(r *keeperRig)
	}{
		{"granted short lately", func(r *keeperRig) { r.grant("k", 100) }},
		{"the latest grant short", func(r *keeperRig) {
			r.grant("k", 100)
			r.now = r.now.Add(20 * time.Second)
		}},
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
	t.Run("fresh keeper", func(t *testing.T) {
		r := newKeeperRig(t)
		r.set("k", 300_000)
		r.set("k", 400_000) // within ShortFor of the start: untouched is not known full
		r.wantStored("k", 400_000)
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
	r.k.KeepRaises(true) // the grants seen before count no longer
	r.set("k", 500_000)
	r.wantStored("k", 500_000)
}

// TestShareKeeperNeverAboveExchange: whatever the order of share updates,
// grants, flushes, resets, failed writes and deletions, no grant sees a
// larger share than the exchange's latest update of its key, nor does the
// store hold one for a key without a deferred update, and a flush after a grant that found
// a key short leaves the store at the exchange's share.
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
			if g.Granted == 0 || g.Tokens < g.Capacity-1 || g.Tokens < 1 {
				r.flush()
				if got, ok := latest[key]; ok && inForce(key) != got {
					t.Fatalf("step %d: %s found short, flushed: store %d, exchange %d", step, key, inForce(key), got)
				}
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
	if c.Kept == 0 || c.Flushed == 0 || c.Same == 0 || c.Capped == 0 {
		t.Fatalf("nothing kept or flushed (%+v): the test checks nothing", c)
	}
}

// TestShareKeeperSlowBuckets: a key that no grant was seen for is kept as
// full only when its bucket refills within Quiet; a slow one (a quota of a
// few tokens in ten minutes) may be empty, and its raises are written.
func TestShareKeeperSlowBuckets(t *testing.T) {
	r := newKeeperRig(t)
	slow := lease.Limit{Rate: 0.01, Burst: 10, Cost: 1, InitialShare: 333_333}
	set := func(key string, l lease.Limit, ppm int64) {
		t.Helper()
		if err := r.k.SetShares(context.Background(), r.mem.SetShares, []lease.ShareUpdate{{Key: key, SharePPM: ppm, Limit: l}}, make([]lease.ShareResult, 1)); err != nil {
			t.Fatal(err)
		}
	}
	set("slow", slow, 300_000)
	set("fast", userLimit, 300_000)
	r.now = r.now.Add(time.Hour - time.Second) // within MaxKeep
	set("slow", slow, 400_000)
	set("fast", userLimit, 400_000)
	r.wantStored("slow", 400_000)
	r.wantStored("fast", 300_000)
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
// replaces a deferred one; a failed deferred write fails the grant and
// stays deferred.
func TestShareKeeperDefers(t *testing.T) {
	r := newKeeperRig(t)
	fail := false
	k, err := NewShareKeeper(ShareKeeperConfig{Store: r.mem, Clock: func() time.Time { return r.now },
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

	// With tokens: written at the grant.
	if err := r.k.SetShares(context.Background(), r.mem.SetShares, []lease.ShareUpdate{{Key: "y", SharePPM: 800_000, Limit: userLimit, Gen: 1, Received: 1000}}, make([]lease.ShareResult, 1)); err != nil {
		t.Fatal(err)
	}
	fail = true
	if err := r.k.Grant(context.Background(), []lease.GrantRequest{{Key: "y", Want: 1, Limit: userLimit}}, make([]lease.Grant, 1)); err == nil {
		t.Fatal("a grant whose deferred write failed succeeded")
	}
	fail = false
	r.wantStored("y", -1)
	r.grant("y", 1)
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

// TestShareKeeperSettleOrder: an exchange write of a key whose deferred
// update a grant is writing waits for that write, so that the store ends
// at the exchange's share.
func TestShareKeeperSettleOrder(t *testing.T) {
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
	// Deferred, and written at the grant: it carries tokens.
	if err := k.SetShares(context.Background(), r.mem.SetShares, []lease.ShareUpdate{{Key: "k", SharePPM: 900_000, Limit: userLimit, Gen: 1, Received: 2000}}, make([]lease.ShareResult, 1)); err != nil {
		t.Fatal(err)
	}
	granted := make(chan error, 1)
	go func() {
		granted <- k.Grant(context.Background(), []lease.GrantRequest{{Key: "k", Want: 1, Limit: userLimit}}, make([]lease.Grant, 1))
	}()
	<-started
	exchanged := make(chan error, 1)
	go func() {
		exchanged <- k.SetShares(context.Background(), r.mem.SetShares, []lease.ShareUpdate{{Key: "k", SharePPM: 100_000, Limit: userLimit}}, make([]lease.ShareResult, 1))
	}()
	close(release)
	if err := <-granted; err != nil {
		t.Fatal(err)
	}
	if err := <-exchanged; err != nil {
		t.Fatal(err)
	}
	r.wantStored("k", 100_000)
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
