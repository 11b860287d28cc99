package faults

import (
	"testing"
	"time"
)

// TestWorstWindow checks the row's arithmetic on a recording made by
// hand: the worst window, its length and start, and that only windows
// meeting the fault count. It needs no RATION_FAULTS.
func TestWorstWindow(t *testing.T) {
	r := newRecorder()
	at := func(d time.Duration) time.Time { return r.start.Add(d) }
	// 30 s at L, then, in [12 s, 13 s), 2,100 more: the 10 s windows that
	// hold that second admit L·W + B exactly.
	for i := range 3000 {
		r.add(at(time.Duration(i)*slot), int64(limit*slot.Seconds()))
	}
	r.add(at(12500*time.Millisecond), 2100)
	for _, tc := range []struct {
		name     string
		from, to time.Duration
		want     float64
		win      time.Duration // 0: either (a 1 s and a 10 s window tie)
	}{
		{"a fault in the burst", 12 * time.Second, 12 * time.Second, 1, 0},
		{"a fault 2 s after it", 15 * time.Second, 15 * time.Second, 1, 10 * time.Second}, // only 10 s windows reach back to it
		{"a fault 11 s after it", 24 * time.Second, 25 * time.Second, 10000 / allowance(10*time.Second), 10 * time.Second},
	} {
		ratio, win, start := r.worst(at(tc.from), at(tc.to), at(30*time.Second))
		if d := ratio - tc.want; d < -1e-9 || d > 1e-9 || (tc.win != 0 && win != tc.win) {
			t.Errorf("%s: got ratio %.6f over %v, want %.6f over %v", tc.name, ratio, win, tc.want, tc.win)
		}
		if s := start.Sub(r.start); s+win > 30*time.Second || s > tc.to || s+win < tc.from {
			t.Errorf("%s: worst window [%v, %v) outside the recording or not meeting [%v, %v]", tc.name, s, s+win, tc.from, tc.to)
		}
	}
	// One second holding the extra tokens: 3,100 ÷ (1,000 + 2,100).
	if got := float64(r.admitted(at(12*time.Second), at(13*time.Second))) / allowance(time.Second); got != 1 {
		t.Errorf("the 1 s window of the burst: ratio %v, want 1", got)
	}
}
