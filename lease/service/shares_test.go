package service

import (
	"context"
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
// grants, flushes and resets, the store never holds a larger share than the
// exchange's latest update of the key, and a flush after a grant that found
// a key short leaves the store at the exchange's share.
func TestShareKeeperNeverAboveExchange(t *testing.T) {
	seed, err := strconv.ParseUint(os.Getenv("RATION_SEED"), 10, 64)
	if err != nil || seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: RATION_SEED=%d go test ./lease/service -run '%s')", seed, seed, t.Name())
	rng := rand.New(rand.NewPCG(seed, 2))
	r := newKeeperRig(t)
	keys := []string{"a", "b", "c", "d"}
	latest := map[string]int64{}
	for step := range 5000 {
		key := keys[rng.IntN(len(keys))]
		switch op := rng.IntN(10); {
		case op < 4:
			ppm := rng.Int64N(1_000_001)
			r.set(key, ppm)
			latest[key] = ppm
		case op < 7:
			g := r.grant(key, 1+rng.Int64N(8))
			if g.Err != nil {
				t.Fatalf("step %d: grant: %v", step, g.Err)
			}
			if g.Granted == 0 || g.Tokens < g.Capacity-1 || g.Tokens < 1 {
				r.flush()
				if got, ok := latest[key]; ok && r.stored(key) != got {
					t.Fatalf("step %d: %s found short, flushed: store %d, exchange %d", step, key, r.stored(key), got)
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
			if want, ok := latest[k]; ok {
				if got := r.stored(k); got > want {
					t.Fatalf("step %d: store's share of %s %d above the exchange's %d", step, k, got, want)
				}
			}
		}
	}
	c := r.k.Counts()
	t.Logf("counts %+v", c)
	if c.Kept == 0 || c.Flushed == 0 {
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
