package kvstore

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden diffs in testdata/diff")

// TestDiffGolden compares Diff with the expected diffs in testdata/diff
// (NAME.a, NAME.b, NAME.diff). The expected ones were made with GNU diff
// -u, less its two header lines, except myers: the example of Myers's
// paper, where GNU diff picks another script of the same length.
func TestDiffGolden(t *testing.T) {
	as, err := filepath.Glob("testdata/diff/*.a")
	if err != nil || len(as) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	for _, a := range as {
		name := strings.TrimSuffix(a, ".a")
		t.Run(filepath.Base(name), func(t *testing.T) {
			x, y := read(t, a), read(t, name+".b")
			got := Diff(x, y)
			if *update {
				if err := os.WriteFile(name+".diff", []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if want := string(read(t, name+".diff")); got != want {
				t.Errorf("got:\n%s\nwant:\n%s", got, want)
			}
			checkPatch(t, x, y, got)
		})
	}
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDiffEqual(t *testing.T) {
	if d := Diff([]byte("a\nb\n"), []byte("a\nb\n")); d != "" {
		t.Errorf("equal documents: %q", d)
	}
	if d := Diff(nil, nil); d != "" {
		t.Errorf("empty documents: %q", d)
	}
}

// TestDiffRandom checks, on random documents over a small alphabet of
// lines, that the diff turns a into b and is as short as the longest
// common subsequence allows (a naive quadratic LCS is the reference).
func TestDiffRandom(t *testing.T) {
	rng := newRand(t)
	for i := range 2000 {
		gen := func() []byte {
			var b bytes.Buffer
			for range rng.IntN(25) {
				b.WriteString(string(rune('a' + rng.IntN(4))))
				b.WriteByte('\n')
			}
			if rng.IntN(4) == 0 {
				b.WriteString("z")
			}
			return b.Bytes()
		}
		x, y := gen(), gen()
		d := Diff(x, y)
		checkPatch(t, x, y, d)
		xs, ys := splitLines(x), splitLines(y)
		want := len(xs) + len(ys) - 2*lcs(xs, ys)
		if got := changedLines(d); got != want {
			t.Fatalf("case %d: %d changed lines, want %d\na=%q\nb=%q\n%s", i, got, want, x, y, d)
		}
	}
}

// TestDiffBounded diffs two large documents that share nothing: past the
// bounds the diff is a wholesale replacement, still correct.
func TestDiffBounded(t *testing.T) {
	var x, y bytes.Buffer
	x.WriteString("head\n")
	y.WriteString("head\n")
	for i := range 50_000 {
		fmt.Fprintf(&x, "a %d\n", i)
		fmt.Fprintf(&y, "b %d\n", i)
	}
	x.WriteString("tail\n")
	y.WriteString("tail\n")
	d := Diff(x.Bytes(), y.Bytes())
	checkPatch(t, x.Bytes(), y.Bytes(), d)
	if !strings.HasPrefix(d, "@@ -1,50002 +1,50002 @@\n head\n-a 0\n") {
		t.Errorf("diff starts %q", d[:40])
	}
	if got := changedLines(d); got != 100_000 {
		t.Errorf("%d changed lines, want 100000", got)
	}
}

func lcs(a, b []string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for i := range a {
		for j := range b {
			if a[i] == b[j] {
				cur[j+1] = prev[j] + 1
			} else {
				cur[j+1] = max(prev[j+1], cur[j])
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func changedLines(d string) int {
	n := 0
	for _, l := range strings.Split(d, "\n") {
		if strings.HasPrefix(l, "+") || strings.HasPrefix(l, "-") {
			n++
		}
	}
	return n
}

// checkPatch applies the unified diff d to x, checking its hunk headers
// and context, and compares the result with y.
func checkPatch(t *testing.T, x, y []byte, d string) {
	t.Helper()
	xs := splitLines(x)
	var out []string
	pos := 0 // lines of x consumed
	lines := strings.SplitAfter(d, "\n")
	for i := 0; i < len(lines) && lines[i] != ""; {
		h := lines[i]
		var as, an, bs, bn int
		if !parseHunk(h, &as, &an, &bs, &bn) {
			t.Fatalf("bad hunk header %q in\n%s", h, d)
		}
		start := as - 1
		if an == 0 {
			start = as
		}
		if start < pos {
			t.Fatalf("hunk %q overlaps the one before", h)
		}
		out = append(out, xs[pos:start]...)
		pos = start
		if got := len(out); (bn == 0 && got != bs) || (bn > 0 && got != bs-1) {
			t.Fatalf("hunk %q: new side starts after line %d", h, got)
		}
		i++
		ga, gb := 0, 0
		for i < len(lines) && lines[i] != "" && !strings.HasPrefix(lines[i], "@@") {
			l := lines[i]
			i++
			text := l[1:]
			if i < len(lines) && strings.HasPrefix(lines[i], "\\ No newline") {
				text = strings.TrimSuffix(text, "\n")
				i++
			}
			switch l[0] {
			case ' ', '-':
				if pos >= len(xs) || xs[pos] != text {
					t.Fatalf("hunk %q: line %q does not match line %d of a", h, text, pos+1)
				}
				pos++
				ga++
				if l[0] == ' ' {
					out = append(out, text)
					gb++
				}
			case '+':
				out = append(out, text)
				gb++
			default:
				t.Fatalf("bad diff line %q", l)
			}
		}
		if ga != an || gb != bn {
			t.Fatalf("hunk %q holds %d and %d lines", h, ga, gb)
		}
	}
	out = append(out, xs[pos:]...)
	if got := strings.Join(out, ""); got != string(y) {
		t.Fatalf("patching a gives\n%q\nwant\n%q\ndiff:\n%s", got, y, d)
	}
}

func parseHunk(h string, as, an, bs, bn *int) bool {
	var a, b string
	if _, err := fmt.Sscanf(h, "@@ -%s +%s @@\n", &a, &b); err != nil {
		return false
	}
	return parseRange(a, as, an) && parseRange(b, bs, bn)
}

func parseRange(s string, start, n *int) bool {
	p, q, ok := strings.Cut(s, ",")
	var err error
	if *start, err = strconv.Atoi(p); err != nil {
		return false
	}
	*n = 1
	if ok {
		*n, err = strconv.Atoi(q)
	}
	return err == nil
}
