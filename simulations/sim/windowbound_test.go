package sim

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// windowDoc is a scenario of one fixed window of 10 a minute in two
// regions. The run starts at 22:13:20 UTC: its first window ends 40 s in.
const windowDoc = "name: w\nduration: 2m\nregions: [us, eu]\nkeys:\n  - { name: k, limit: 10, period: 1m, algorithm: fixed_window }\n" +
	"demand:\n  - { at: 0s, rates: { us: 1 } }\n"

// boundary is the run's first window boundary, in ns since its start.
const boundary = int64(40 * time.Second)

func windowWorld(t *testing.T, doc string, alg Algorithm) *world {
	t.Helper()
	w, err := newWorld(parseDoc(t, "w.yaml", doc), alg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// admit counts n tokens of key 0 admitted in region ri at t.
func admit(w *world, ri int, n int, t int64) {
	for ; n > 0; n-- {
		w.m.admitted(0, ri, 1, t)
	}
}

// TestWindowBoundCatchesOverAdmission: one token more than the limit in a
// window breaks the window bound, however the tokens spread over the
// regions and the window; the limit on each side of a boundary, twice the
// limit within a second, does not; and the sliding bound of token buckets
// does not look at fixed windows.
func TestWindowBoundCatchesOverAdmission(t *testing.T) {
	// Static: each region's bucket holds half the limit, 5 ≥ 1 cost, so
	// the bound is the limit, 10.
	w := windowWorld(t, windowDoc, Static)
	admit(w, 0, 4, boundary-int64(30*time.Second))
	admit(w, 1, 6, boundary-int64(time.Millisecond)) // 10: at the limit
	admit(w, 0, 10, boundary)                        // the next window: 10 more at once
	admit(w, 1, 1, boundary+int64(59*time.Second))   // and one more: 11
	w.m.closeWindows()
	got := w.m.windowBound()
	if got == nil || got.Windows != 2 || got.WindowsOver != 1 || math.Abs(got.RatioMax-1.1) > 1e-9 || got.AdmittedMaxPct != 110 || got.BoundTokens != 10 {
		t.Fatalf("got %+v, want 2 windows, 1 over, ratio 1.1, admitted max 110%%, bound 10", got)
	}
	s := w.result().Summary
	if !s.BoundBroken() || s.BoundRatioMax != 0 || s.WindowsOverBound != 0 || s.OvershootPct.S1 != nil {
		t.Errorf("got bound broken %v, sliding ratio %v over %d overshoot %v; want broken by the window bound only", s.BoundBroken(), s.BoundRatioMax, s.WindowsOverBound, s.OvershootPct.S1)
	}
}

// TestWindowBoundTerms: a fault's excess raises the bound of the windows
// it meets, and only those; a rule failing open has no bound while it does;
// escrow's floor share adds one cost per region whose limit × floor is
// below a cost.
func TestWindowBoundTerms(t *testing.T) {
	w := windowWorld(t, windowDoc, Static)
	w.m.addFault(0, boundary+int64(10*time.Second), boundary+int64(11*time.Second), 3)
	admit(w, 0, 11, 0)          // the first window: over
	admit(w, 0, 13, boundary+1) // the second, with the fault's 3 tokens: at its bound
	w.m.closeWindows()
	if got := w.m.windowBound(); got.WindowsOver != 1 || got.RatioMax != 1.1 {
		t.Errorf("got %+v, want only the first window over (ratio 1.1), the second within 10 + 3", got)
	}

	w = windowWorld(t, windowDoc, Static)
	w.m.addFault(0, 0, math.MaxInt64, math.Inf(1))
	admit(w, 0, 50, 0)
	w.m.closeWindows()
	if got := w.m.windowBound(); got.Windows != 1 || got.WindowsOver != 0 {
		t.Errorf("failing open: got %+v, want the window counted and not checked", got)
	}

	w = windowWorld(t, windowDoc, Escrow)
	if got, want := w.m.keys[0].win.base, 12.0; got != want {
		t.Errorf("escrow's bound without faults: got %v, want %v (10 × 0.5%% floor is below a cost, in 2 regions)", got, want)
	}
}

// TestWindowBoundCountsStoreClocks: a request is counted in the window its
// region's store is in, on that store's clock: a region whose clock is
// 50 ms ahead admits the next window's tokens 50 ms before the true
// boundary, and they count there.
func TestWindowBoundCountsStoreClocks(t *testing.T) {
	w := windowWorld(t, windowDoc, Static)
	w.rs[0].storeSkew = int64(50 * time.Millisecond)
	w.m = newMeter(w)
	admit(w, 0, 10, boundary-int64(20*time.Millisecond)) // us: already the next window
	admit(w, 1, 10, boundary-int64(20*time.Millisecond)) // eu: still the first
	wm := w.m.keys[0].win
	if len(wm.open) != 2 || wm.open[0].admitted != 10 || wm.open[1].admitted != 10 || wm.open[1].start != boundary {
		t.Fatalf("got open windows %+v, want 10 in the first and 10 in the one from %v", wm.open, time.Duration(boundary))
	}
	w.m.closeWindows()
	if got := w.m.windowBound(); got.Windows != 2 || got.WindowsOver != 0 {
		t.Errorf("got %+v, want 2 windows within the bound", got)
	}
}

// TestWindowRaiseTerm: a share raised in a region whose store is still in
// the window before, while another region's store is in the next, is
// counted again when the raised region enters the next window: limit × the
// raise is added to that window's bound. A raise with every store in the
// same window, or a lowering, adds nothing.
func TestWindowRaiseTerm(t *testing.T) {
	w := windowWorld(t, windowDoc, Escrow)
	us, eu := w.rs[w.sc.regionIndex("us")], w.rs[w.sc.regionIndex("eu")]
	// Both behind true time: the most advanced store is us's.
	us.storeSkew, eu.storeSkew = -int64(10*time.Millisecond), -int64(110*time.Millisecond)
	key := w.keys[0].storeKey
	write := func(r *regiond, at int64, share int64) {
		w.now = at
		if got := (regionFx{w, r}).WriteShares(w.ctx, []region.ShareChange{{Key: key, SharePPM: share}}); len(got) != 1 {
			t.Fatalf("writing a share: got %v", got)
		}
	}
	write(eu, boundary-int64(time.Second), 600_000)         // every store in the first window
	write(eu, boundary-int64(10*time.Millisecond), 500_000) // a lowering
	write(us, boundary+int64(5*time.Millisecond), 550_000)  // us, the most advanced, is not past it yet
	write(eu, boundary+int64(50*time.Millisecond), 700_000) // us is past the boundary, eu not
	write(us, boundary+int64(60*time.Millisecond), 800_000) // us itself is the most advanced
	faults := w.m.keys[0].faults
	if len(faults) != 1 {
		t.Fatalf("got fault spans %+v, want one", faults)
	}
	// eu's store enters the next window at the boundary of its own clock.
	if f := faults[0]; f.from != boundary || math.Abs(f.tokens-2) > 1e-9 {
		t.Errorf("got span %+v, want 10 × 0.2 = 2 tokens from %v", f, time.Duration(boundary))
	}
}

// TestWindowsFollowStartAndTimeZone: start puts the run where a scenario
// wants its boundaries, and the windows are the rule's, in its time zone:
// 10 s before midnight in Berlin after the clocks went back (the 25-hour
// day of 25 October 2026), a daily window ends 10 s in and the next one
// starts full.
func TestWindowsFollowStartAndTimeZone(t *testing.T) {
	if _, err := time.LoadLocation("Europe/Berlin"); err != nil {
		t.Skipf("no time zone database: %v", err)
	}
	doc := "name: w\nstart: 2026-10-25T23:59:50+01:00\nduration: 20s\nregions: [us, eu]\nagents_per_region: 2\n" +
		"keys:\n  - { name: k, limit: 100, period: day, algorithm: fixed_window, time_zone: Europe/Berlin }\n" +
		"demand:\n  - { at: 0s, rates: { us: 30, eu: 30 } }\n"
	for _, alg := range Algorithms {
		res, err := Run(parseDoc(t, "w.yaml", doc), Options{Algorithm: alg})
		if err != nil {
			t.Fatal(err)
		}
		s := res.Summary
		if b := s.WindowBound; b == nil || b.Windows != 2 || s.BoundBroken() {
			t.Errorf("%s: got window bound %+v, want 2 windows within the bound", alg, b)
		}
		t.Logf("%s: admitted %d, window bound %+v", alg, s.Admitted, s.WindowBound)
		if alg == Ideal && s.Admitted != 200 {
			t.Errorf("ideal: admitted %d, want 200: the day's 100, then the next day's", s.Admitted)
		}
		if alg == Escrow && s.Admitted < 150 {
			t.Errorf("escrow: admitted %d, want most of both days' 100", s.Admitted)
		}
	}
	// Without start, the same 20 s are inside one day.
	res, err := Run(parseDoc(t, "w.yaml", strings.Replace(doc, "start: 2026-10-25T23:59:50+01:00\n", "", 1)), Options{Algorithm: Ideal})
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Summary; s.Admitted != 100 || s.WindowBound.Windows != 1 {
		t.Errorf("default start: admitted %d in %d windows, want 100 in 1", s.Admitted, s.WindowBound.Windows)
	}
}

// TestWindowSkewDoubleCount: the skew term is needed, and enough. With the
// stores 800 ms apart (us 400 ms ahead, eu 400 ms behind), demand moving
// from us to eu 1.5 s before a boundary makes us, already in the new
// window and full at its old share, give that share to eu while eu is
// still in the window before: eu then enters the new window full at the
// raised share, and the window admits 60% above its limit. The raise is
// counted in that window's bound, which it stays within. The agents hear
// no dry-key notices here: the term is for the worst case, and agents that
// deny from a notice admit less (an older agent, or one whose WatchDry
// stream is down, does not).
func TestWindowSkewDoubleCount(t *testing.T) {
	doc := "name: dc\nseed: 3\nstart: 2026-03-29T00:58:00+01:00\nduration: 2m\nregions: [us, eu]\nagents_per_region: 4\n" +
		"network: { delay: 20ms }\nkeys:\n  - { name: k, limit: 1000, period: 1m, algorithm: fixed_window }\n" +
		"demand:\n  - { at: 0s, rates: { us: 30 } }\n  - { at: 58.5s, rates: { eu: 3000 } }\n"
	w := windowWorld(t, doc, Escrow)
	w.noDry = true
	us, eu := w.rs[w.sc.regionIndex("us")], w.rs[w.sc.regionIndex("eu")]
	us.skew, us.storeSkew = int64(400*time.Millisecond), int64(400*time.Millisecond)
	eu.skew, eu.storeSkew = -int64(400*time.Millisecond), -int64(400*time.Millisecond)
	w.m = newMeter(w)
	w.loop(nil)
	b := w.m.windowBound()
	if len(w.m.keys[0].faults) == 0 || b.AdmittedMaxPct < 150 || b.WindowsOver != 0 || b.RatioMax > 1 {
		t.Errorf("got %d skew spans, window bound %+v; want a window above 150%% of the limit, within its bound with the skew term", len(w.m.keys[0].faults), b)
	}
}
