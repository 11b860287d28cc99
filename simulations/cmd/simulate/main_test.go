package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("name: x\nduration: soon\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"bad scenario", []string{"-scenario", bad}, exitUsage, bad + `:2: duration: must be a Go duration`},
		{"missing scenario", nil, exitUsage, "-scenario FILE is required"},
		{"bad algorithm", []string{"-scenario", bad, "-algorithm", "fast"}, exitUsage, `-algorithm "fast"`},
		{"bad seed", []string{"-scenario", "../../sim/testdata/golden.yaml", "-seed", "x"}, exitUsage, `-seed "x"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if got := run(tc.args, &out, &errb); got != tc.code {
				t.Errorf("exit status got %d, want %d (stderr %q)", got, tc.code, errb.String())
			}
			if !strings.Contains(errb.String(), tc.stderr) {
				t.Errorf("stderr got %q, want it to contain %q", errb.String(), tc.stderr)
			}
		})
	}
}

func TestRunWritesOutputs(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	code := run([]string{"-scenario", "../../sim/testdata/golden.yaml", "-algorithm", "escrow,ideal", "-out", dir}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit status got %d, want 0; stderr %s", code, errb.String())
	}
	for _, f := range []string{"escrow/summary.json", "escrow/series.csv", "escrow/bound.png", "ideal/summary.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("got %v, want %s written", err, f)
		}
	}
	for _, want := range []string{"escrow", "ideal", "bound ratio max"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table got\n%s\nwant it to contain %q", out.String(), want)
		}
	}
}

// TestFixedWindowOutputs: a run with fixed windows prints the window
// bound's rows.
func TestFixedWindowOutputs(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"-scenario", "../../scenarios/window-boundary.yaml", "-algorithm", "escrow,ideal", "-out", t.TempDir()}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit status got %d, want 0; stderr %s", code, errb.String())
	}
	for _, want := range []string{"fixed windows checked", "window bound ratio max", "windows over window bound", "admitted vs ideal"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table got\n%s\nwant it to contain %q", out.String(), want)
		}
	}
}

// TestReadmeTable: -readme rewrites the table between its markers, with a
// "vs ideal" column after utilization and, for fixed windows, the window
// bound's ratio as the bound ratio.
func TestReadmeTable(t *testing.T) {
	readme := filepath.Join(t.TempDir(), "README.md")
	if err := os.WriteFile(readme, []byte("# x\n\n"+tableBegin+"\nold\n"+tableEnd+"\n\nafter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"-quiet", "-readme", readme, "../../scenarios/window-boundary.yaml"}, &out, &errb); code != exitOK {
		t.Fatalf("exit status got %d, want 0; stderr %s", code, errb.String())
	}
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.Contains(doc, "| bound ratio max | utilization | vs ideal | Jain |") || strings.Contains(doc, "old") || !strings.HasSuffix(doc, tableEnd+"\n\nafter\n") {
		t.Fatalf("got README\n%s\nwant the new table's header between the markers, the rest kept", doc)
	}
	// ideal admits its limit in every window: ratio 1, and 100% of itself.
	if !strings.Contains(doc, "| window-boundary | ideal | 28.62% | - | - | - | 1.000 | 29.15% | 100.00% |") {
		t.Errorf("got README\n%s\nwant ideal's row with bound ratio 1.000 and vs ideal 100.00%%", doc)
	}
}
