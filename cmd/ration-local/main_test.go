package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"strings"
	"testing"

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
	if !strings.HasSuffix(s, "stopping\n") {
		t.Errorf("output does not end with stopping:\n%s", s)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-limit", "1"}, {"-sync-period", "1ms"}, {"-shift", "0s"}, {"-nope"}} {
		if err := run(context.Background(), args, io.Discard, io.Discard); err == nil {
			t.Errorf("run(%q): got nil, want an error", args)
		}
	}
}
