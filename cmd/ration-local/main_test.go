package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunsAndStops runs the demo for a few seconds in-process: it must
// print a table every second with every region and a total, stop by
// itself, and leave no goroutine behind.
func TestRunsAndStops(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"-duration", "3500ms", "-sync-period", "100ms", "-shift", "1s"}, &out, io.Discard)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	s := out.String()
	tables := strings.Count(s, "  total ")
	if tables < 2 {
		t.Fatalf("got %d tables, want at least 2:\n%s", tables, s)
	}
	for _, r := range regions {
		if !regexp.MustCompile(`(?m)^  ` + r + ` +\d+\.\d%`).MatchString(s) {
			t.Errorf("no share line for %s:\n%s", r, s)
		}
	}
	// Each second is labelled with the demand it answered: with -shift 1s
	// the second that ends at t=Ns leans on region N-1 (mod 3).
	lines := regexp.MustCompile(`(?m)^t=(\d+)s +demand/s: us (\d+) eu (\d+) ap (\d+)$`).FindAllStringSubmatch(s, -1)
	if len(lines) < 2 {
		t.Fatalf("got %d demand lines, want at least 2:\n%s", len(lines), s)
	}
	for _, l := range lines {
		n, _ := strconv.Atoi(l[1])
		hot := (n - 1) % len(regions)
		for i := range regions {
			want := map[int]string{0: "900", 1: "200", 2: "100"}[(i-hot+len(regions))%len(regions)]
			if l[2+i] != want {
				t.Errorf("%q: %s's demand is %s, want %s (the demand of that second)", l[0], regions[i], l[2+i], want)
			}
		}
	}
	if !regexp.MustCompile(`(?m)^  total +\d+\.\d% +\d+ +\d+  \(limit 1000/s\)$`).MatchString(s) {
		t.Errorf("no total line with the limit:\n%s", s)
	}
	if !strings.HasSuffix(s, "stopping\n") {
		t.Errorf("output does not end with stopping:\n%s", s)
	}
}

// TestDemandDuring: a second that ends just after the demand moved shows
// the demand before the move (the one its admissions answered).
func TestDemandDuring(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	g := &generator{limit: 1000, shift: 10 * time.Second, start: t0}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for _, tc := range []struct {
		from, to time.Duration
		want     [3]int64
	}{
		{0, time.Second, [3]int64{900, 200, 100}},
		{9*time.Second + 3*time.Millisecond, 10*time.Second + 3*time.Millisecond, [3]int64{900, 200, 100}},
		{10*time.Second + 3*time.Millisecond, 11*time.Second + 3*time.Millisecond, [3]int64{100, 900, 200}},
		// A tick that came late (a second skipped): the middle decides.
		{9 * time.Second, 11*time.Second + 500*time.Millisecond, [3]int64{100, 900, 200}},
		{29 * time.Second, 30 * time.Second, [3]int64{200, 100, 900}},
		{30 * time.Second, 31 * time.Second, [3]int64{900, 200, 100}},
	} {
		var got [3]int64
		for i := range regions {
			got[i] = g.demandDuring(i, at(tc.from), at(tc.to))
		}
		if got != tc.want {
			t.Errorf("demand over %v..%v: got %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

// TestSecondTable is the table of one second, the limit beside the total.
func TestSecondTable(t *testing.T) {
	var b strings.Builder
	second{
		elapsed: 10*time.Second + 3*time.Millisecond, limit: 1000,
		demand: [3]int64{900, 200, 100}, share: [3]float64{0.654, 0.224, -1},
		admitted: [3]int64{654, 201, 99}, denied: [3]int64{242, 0, 0},
	}.write(&b)
	want := `t=10s  demand/s: us 900 eu 200 ap 100
  region   share  admitted  denied
  us       65.4%       654     242
  eu       22.4%       201       0
  ap           ?        99       0
  total    87.8%       954     242  (limit 1000/s)

`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-limit", "1"}, {"-sync-period", "1ms"}, {"-shift", "0s"}, {"-nope"}} {
		if err := run(context.Background(), args, io.Discard, io.Discard); err == nil {
			t.Errorf("run(%q): got nil, want an error", args)
		}
	}
}
