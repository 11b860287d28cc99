package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/region"
)

// TestMemoryStoreSteps walks one key through fixed instants and checks
// every answer exactly, including a clock that goes backwards.
func TestMemoryStoreSteps(t *testing.T) {
	l := Limit{Rate: 10, Burst: 20, Cost: 1, InitialShare: region.PPM}
	m := NewMemoryStore(MemoryConfig{})
	at := func(d time.Duration) time.Time { return epoch.Add(d) }
	steps := []struct {
		at   time.Duration
		want int64
		got  Grant
	}{
		{0, 15, Grant{Granted: 15, Tokens: 5}},
		{500 * time.Millisecond, 20, Grant{Granted: 10}},                                  // refilled 5
		{500 * time.Millisecond, 1, Grant{RetryAfter: 100 * time.Millisecond}},            // no time passed
		{550 * time.Millisecond, 1, Grant{RetryAfter: 50 * time.Millisecond, Tokens: .5}}, // half a token
		{-time.Hour, 1, Grant{RetryAfter: 50 * time.Millisecond, Tokens: .5}},             // clock jumped back: clamped
		{600 * time.Millisecond, 1, Grant{Granted: 1}},                                    // back on time
		{10 * time.Second, 100, Grant{Granted: 20}},                                       // capped at capacity
	}
	for i, s := range steps {
		out := make([]Grant, 1)
		m.GrantAt(at(s.at), []GrantRequest{{Key: "k", Want: s.want, Limit: l}}, out)
		want := s.got
		want.Rate, want.Capacity, want.SharePPM = 10, 20, region.PPM
		if diff := cmp.Diff(want, out[0], cmp.Comparer(func(a, b float64) bool { return abs(a-b) < 1e-9 })); diff != "" {
			t.Errorf("step %d (at %v, want %d): (-want +got):\n%s", i, s.at, s.want, diff)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// TestMemoryStoreBackwardClock: a clock that goes back never refills and
// never drives a bucket negative, however the calls interleave.
func TestMemoryStoreBackwardClock(t *testing.T) {
	l := Limit{Rate: 1000, Burst: 10, Cost: 1, InitialShare: region.PPM}
	m := NewMemoryStore(MemoryConfig{})
	out := make([]Grant, 1)
	m.GrantAt(epoch, []GrantRequest{{Key: "k", Want: 10, Limit: l}}, out)
	var total int64
	for i := range 100 {
		// Oscillate around epoch − 1s: every instant is before last.
		now := epoch.Add(-time.Second + time.Duration(i%7)*time.Millisecond)
		m.GrantAt(now, []GrantRequest{{Key: "k", Want: 5, Limit: l}}, out)
		if out[0].Tokens < 0 {
			t.Fatalf("step %d: got %v tokens, want ≥ 0", i, out[0].Tokens)
		}
		total += out[0].Granted
		if err := m.ReturnAt(now, []ReturnRequest{{Key: "k", Tokens: 1, Limit: l}}); err != nil {
			t.Fatal(err)
		}
		m.GrantAt(now, []GrantRequest{{Key: "k", Want: 1, Limit: l}}, out)
		total += out[0].Granted
	}
	// Only the returned tokens came back; the clock added none.
	if total != 100 {
		t.Errorf("got %d granted while the clock was behind, want 100 (the returned tokens)", total)
	}
}

func TestMemoryStoreSweep(t *testing.T) {
	l := Limit{Rate: 1000, Burst: 10, Cost: 1, InitialShare: region.PPM} // expires after 20ms
	slow := Limit{Rate: 1, Burst: 10, Cost: 1, InitialShare: region.PPM} // after 20s
	m := NewMemoryStore(MemoryConfig{})
	out := make([]Grant, 3)
	m.GrantAt(epoch, []GrantRequest{{Key: "a", Want: 1, Limit: l}, {Key: "b", Want: 1, Limit: l}, {Key: "c", Want: 1, Limit: slow}}, out)
	if err := m.SetSharesAt(epoch, []ShareUpdate{{Key: "a", SharePPM: 500_000, Limit: l}}, nil); err != nil {
		t.Fatal(err)
	}
	if n := m.Sweep(epoch.Add(20 * time.Millisecond)); n != 0 {
		t.Errorf("got %d swept at the expiry instant, want 0", n)
	}
	if n := m.Sweep(epoch.Add(21 * time.Millisecond)); n != 2 {
		t.Errorf("got %d swept after 21ms, want 2", n)
	}
	if n := m.Sweep(epoch.Add(time.Minute)); n != 1 {
		t.Errorf("got %d swept after a minute, want 1", n)
	}
	shares := make([]int64, 2)
	if err := m.Shares(context.Background(), []string{"a", "b"}, shares); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int64{500_000, -1}, shares); diff != "" {
		t.Errorf("shares after sweep (-want +got):\n%s", diff)
	}
}

// TestMemoryStoreCloneRestore models a failover that loses the writes made
// after a snapshot: restoring the clone brings the old balances back.
func TestMemoryStoreCloneRestore(t *testing.T) {
	l := slow(10, 1)
	m := NewMemoryStore(MemoryConfig{Shards: 3})
	out := make([]Grant, 1)
	m.GrantAt(epoch, []GrantRequest{{Key: "k", Want: 4, Limit: l}}, out)
	snap := m.Clone()
	m.GrantAt(epoch, []GrantRequest{{Key: "k", Want: 6, Limit: l}}, out)
	if err := m.SetSharesAt(epoch, []ShareUpdate{{Key: "k", SharePPM: 1, Limit: l}}, nil); err != nil {
		t.Fatal(err)
	}
	// The clone is independent of later writes.
	snap.GrantAt(epoch, []GrantRequest{{Key: "k", Want: 100, Limit: l}}, out)
	if out[0].Granted != 6 {
		t.Errorf("clone granted %d, want 6", out[0].Granted)
	}
	// Restore from a store with a different shard count.
	snap2 := NewMemoryStore(MemoryConfig{Shards: 7})
	snap2.GrantAt(epoch, []GrantRequest{{Key: "k", Want: 1, Limit: l}}, out)
	inc0, _ := m.Incarnation(t.Context())
	m.Restore(snap2)
	inc1, _ := m.Incarnation(t.Context())
	m.Restore(m) // a no-op
	if inc2, _ := m.Incarnation(t.Context()); inc1 == inc0 || inc2 != inc1 {
		t.Errorf("incarnations before a restore, after it and after a no-op: %q, %q, %q; want the restore alone to change it", inc0, inc1, inc2)
	}
	got := make([]Grant, 2)
	m.GrantAt(epoch, []GrantRequest{{Key: "k", Want: 100, Limit: l}, {Key: "j", Want: 100, Limit: l}}, got)
	if got[0].Granted != 9 || got[1].Granted != 10 || got[0].Capacity != 10 {
		t.Errorf("after restore: got %+v, want 9 and 10 granted at capacity 10 (share write lost)", got)
	}
}

func TestMemoryStoreDefaultsAndErrors(t *testing.T) {
	m := NewMemoryStore(MemoryConfig{Shards: -3})
	if len(m.shards) != 64 || m.clock == nil {
		t.Errorf("got %d shards, clock set %v; want 64 and time.Now", len(m.shards), m.clock != nil)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	reqs := []GrantRequest{{Key: "k", Want: 1, Limit: slow(10, 1)}}
	if err := m.Grant(ctx, reqs, make([]Grant, 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("Grant with a done context: got %v, want context.Canceled", err)
	}
	if err := m.Ping(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Ping with a done context: got %v, want context.Canceled", err)
	}
	defer func() {
		if recover() == nil {
			t.Errorf("GrantAt with a short out: no panic")
		}
	}()
	m.GrantAt(epoch, reqs, nil)
}
