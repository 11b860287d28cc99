package lease

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
)

// Fixed windows (Limit.Window): the caller gives the boundaries around its
// clock and the store uses the window its own clock is in. The cases move to
// a new window by giving boundaries whose current window starts later (but
// still before the store's clock), so they need not wait for one to end.

// windowAround returns boundaries that put h's clock at offset into a
// window of length d: [start−d, start, start+d, start+2d] with
// start = now − offset.
func windowAround(h *harness, offset, d time.Duration) [4]int64 {
	start := h.now().Add(-offset).UnixMicro()
	us := d.Microseconds()
	return [4]int64{start - us, start, start + us, start + 2*us}
}

// shifted is w moved by k windows.
func shifted(w [4]int64, k int64) [4]int64 {
	d := w[2] - w[1]
	return [4]int64{w[0] + k*d, w[1] + k*d, w[2] + k*d, w[3] + k*d}
}

func fixedLimit(limit float64, w [4]int64) Limit {
	return Limit{Rate: limit / 10, Burst: limit, Cost: 1, InitialShare: region.PPM, Window: w}
}

func confFixedWindow(t *testing.T, h *harness) {
	w := windowAround(h, 2*time.Second, 10*time.Second) // 8 s left in the window
	l := fixedLimit(100, w)
	wantGranted(t, grant1(t, h, "k", 60, l), 60)
	wantGranted(t, grant1(t, h, "k", 60, l), 40)
	g := grant1(t, h, "k", 1, l)
	wantGranted(t, g, 0)
	// No refill within the window: the retry hint is the window's end.
	if g.RetryAfter < 7*time.Second || g.RetryAfter > 8*time.Second {
		t.Errorf("RetryAfter %v in a window with 8 s left, want about 8 s", g.RetryAfter)
	}
	if ttl, ok := h.bucketTTL(t, "k"); !ok || ttl < 7*time.Second || ttl > 8*time.Second+time.Millisecond {
		t.Errorf("bucket TTL %v (exists %v), want the window's end, about 8 s", ttl, ok)
	}
	// A window that starts later: full again.
	next := fixedLimit(100, windowAround(h, time.Second, 10*time.Second))
	wantGranted(t, grant1(t, h, "k", 150, next), 100)
	// Boundaries of the first window again (a caller behind): the bucket
	// stays in the newer window, empty.
	wantGranted(t, grant1(t, h, "k", 150, l), 0)
}

func confFixedWindowOutside(t *testing.T, h *harness) {
	w := shifted(windowAround(h, 0, time.Second), 5) // all in the future
	out := make([]Grant, 1)
	if err := h.store.Grant(context.Background(), []GrantRequest{{Key: "k", Want: 1, Limit: fixedLimit(10, w)}}, out); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(out[0].Err, ErrInvalid) {
		t.Errorf("a grant outside the window's boundaries: got %+v, want ErrInvalid", out[0])
	}
	if err := h.store.SetShares(context.Background(), []ShareUpdate{{Key: "k", SharePPM: 1, Limit: fixedLimit(10, w)}}, nil); err == nil {
		t.Errorf("a share write outside the window's boundaries: got no error")
	}
	for _, bad := range [][4]int64{{1, 1, 2, 3}, {-1, 1, 2, 3}, {4, 3, 2, 1}} {
		l := fixedLimit(10, bad)
		if err := h.store.Grant(context.Background(), []GrantRequest{{Key: "k", Want: 1, Limit: l}}, out); err != nil || !errors.Is(out[0].Err, ErrInvalid) {
			t.Errorf("boundaries %v: got %v / %+v, want ErrInvalid", bad, err, out[0])
		}
	}
}

func confFixedWindowEscrow(t *testing.T, h *harness) {
	w := windowAround(h, time.Second, 10*time.Second)
	l := fixedLimit(400, w)
	l.InitialShare = region.PPM / 4 // capacity 100
	wantGranted(t, grant1(t, h, "k", 20, l), 20)
	// Lowering releases what is above the new capacity, in this window.
	r := setShare1(t, h, ShareUpdate{Key: "k", SharePPM: 100_000, Limit: l})
	if r.Released != 40_000 || r.Window != w[1] {
		t.Fatalf("lowering: %+v, want 40 tokens released in the window starting %d", r, w[1])
	}
	// Tokens given in this window are credited; given in the previous one,
	// never (that window's quota is gone).
	setShare1(t, h, ShareUpdate{Key: "k", SharePPM: region.PPM, Limit: l, Gen: 3, Received: 90_000, Window: w[0]})
	if g := grant1(t, h, "k", 400, l); g.Granted != 40 {
		t.Fatalf("after a gift of the previous window: granted %d, want the 40 held", g.Granted)
	}
	setShare1(t, h, ShareUpdate{Key: "k", SharePPM: region.PPM, Limit: l, Gen: 3, Received: 90_000, Window: w[1]})
	setShare1(t, h, ShareUpdate{Key: "k", SharePPM: region.PPM, Limit: l, Gen: 3, Received: 90_000, Window: w[1]})
	wantGranted(t, grant1(t, h, "k", 400, l), 90)
	// In the next window the bucket is full; tokens of the window before
	// are not credited, those of the new one are, from zero.
	nw := windowAround(h, 500*time.Millisecond, 10*time.Second)
	next := fixedLimit(400, nw)
	next.InitialShare = l.InitialShare
	setShare1(t, h, ShareUpdate{Key: "k", SharePPM: 500_000, Limit: next, Gen: 3, Received: 95_000, Window: w[1]})
	wantGranted(t, grant1(t, h, "k", 150, next), 150)
	setShare1(t, h, ShareUpdate{Key: "k", SharePPM: 500_000, Limit: next, Gen: 3, Received: 7_000, Window: nw[1]})
	wantGranted(t, grant1(t, h, "k", 400, next), 57)
}

// confFixedWindowDST runs a daily window across Berlin's autumn DST change
// (a 25-hour day): the store honours the boundaries the policy cut, whatever
// their length, and the bucket lives until the day's end.
func confFixedWindowDST(t *testing.T, h *harness) {
	set, err := policy.Parse("daily.yaml", []byte(`
rules:
  - name: daily
    key: [tenant]
    algorithm: fixed_window
    limit: 1000
    period: day
    time_zone: Europe/Berlin
`))
	if err != nil {
		t.Fatal(err)
	}
	rule := set.Rules()[0]
	// 2026-10-25 is 25 hours long in Berlin; at 20:00 local, 4 h are left.
	at := time.Date(2026, 10, 25, 20, 0, 0, 0, mustZone(t, "Europe/Berlin"))
	b := rule.Boundaries(at)
	if got := time.Duration(b[2]-b[1]) * time.Microsecond; got != 25*time.Hour {
		t.Fatalf("the policy cut a %v day, want 25h", got)
	}
	// Move the window so that the store's clock is where at is in it.
	shift := h.now().UnixMicro() - at.UnixMicro()
	w := [4]int64{b[0] + shift, b[1] + shift, b[2] + shift, b[3] + shift}
	l := Limit{Rate: rule.Rate(), Burst: float64(rule.Burst), Cost: rule.Cost, InitialShare: region.PPM, Window: w}
	wantGranted(t, grant1(t, h, "tenant=acme", 2000, l), 1000)
	if ttl, ok := h.bucketTTL(t, "tenant=acme"); !ok || math.Abs(ttl.Hours()-4) > 0.01 {
		t.Errorf("bucket TTL %v (exists %v), want the 4 hours left of the 25-hour day", ttl, ok)
	}
	g := grant1(t, h, "tenant=acme", 1, l)
	if g.Granted != 0 || g.RetryAfter != MaxRetryAfter {
		t.Errorf("an empty day: %+v, want nothing and the retry hint capped at %v", g, MaxRetryAfter)
	}
}

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}
