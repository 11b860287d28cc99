package kvstore

import (
	"bytes"
	"strconv"
	"strings"
)

// contextLines is how many unchanged lines surround a hunk.
const contextLines = 3

// Bounds on the diff's work. Myers's algorithm costs O((N+M)·D) time and,
// here, O(D²) memory for D changed lines; past either bound the lines
// between the first and the last difference are shown as all removed and
// all added, which is still a correct diff, only not a minimal one.
const (
	maxEdits = 1000
	maxWork  = 50_000_000
)

// Diff returns the unified diff that turns document a into document b: hunks
// ("@@ -3,7 +3,8 @@") of lines prefixed " ", "-" or "+", with three lines of
// context, and no file header; "" when a and b are equal. A last line
// without a newline is followed by "\ No newline at end of file". The diff
// is minimal (Myers) up to 1000 changed lines.
func Diff(a, b []byte) string {
	if bytes.Equal(a, b) {
		return ""
	}
	x, y := splitLines(a), splitLines(b)
	return unified(x, y, editScript(x, y))
}

// splitLines splits s after each newline; the last line lacks one if s
// does not end with one.
func splitLines(s []byte) []string {
	var out []string
	for len(s) > 0 {
		i := bytes.IndexByte(s, '\n')
		if i < 0 {
			out = append(out, string(s))
			break
		}
		out = append(out, string(s[:i+1]))
		s = s[i+1:]
	}
	return out
}

// edit is one line of an edit script: kept (' '), removed ('-') or added
// ('+'). a and b are the positions in each document at the edit: the line
// kept or removed in a, the line kept or added in b, and otherwise the
// position before which it happens.
type edit struct {
	op   byte
	a, b int
}

// editScript returns the edits that turn x into y, every line of both
// accounted for, in order.
func editScript(x, y []string) []edit {
	ids := make(map[string]int32, len(x)+len(y))
	intern := func(lines []string) []int32 {
		out := make([]int32, len(lines))
		for i, l := range lines {
			id, ok := ids[l]
			if !ok {
				id = int32(len(ids))
				ids[l] = id
			}
			out[i] = id
		}
		return out
	}
	xa, ya := intern(x), intern(y)
	n, m := len(xa), len(ya)
	pre := 0
	for pre < n && pre < m && xa[pre] == ya[pre] {
		pre++
	}
	suf := 0
	for suf < n-pre && suf < m-pre && xa[n-1-suf] == ya[m-1-suf] {
		suf++
	}
	out := make([]edit, 0, max(n, m)+8)
	for i := range pre {
		out = append(out, edit{' ', i, i})
	}
	out = myers(out, xa[pre:n-suf], ya[pre:m-suf], pre, pre)
	for i := range suf {
		out = append(out, edit{' ', n - suf + i, m - suf + i})
	}
	return out
}

// myers appends to out the shortest edit script from a to b, whose lines
// start at a0 and b0 in their documents, or a wholesale replacement when
// that is beyond maxEdits or maxWork.
func myers(out []edit, a, b []int32, a0, b0 int) []edit {
	n, m := len(a), len(b)
	dmax := min(n+m, maxEdits, maxWork/max(n+m, 1))
	off := dmax + 1
	v := make([]int32, 2*dmax+3) // v[off+k]: the furthest x on diagonal k
	var trace [][]int32          // trace[d]: v for k in [-d-1, d+1] before step d
	for d := 0; d <= dmax; d++ {
		trace = append(trace, append([]int32(nil), v[off-d-1:off+d+2]...))
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				x = int(v[off+k+1]) // down: a line of b added
			} else {
				x = int(v[off+k-1]) + 1 // right: a line of a removed
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x, y = x+1, y+1
			}
			v[off+k] = int32(x)
			if x >= n && y >= m {
				return backtrack(out, trace, n, m, a0, b0)
			}
		}
	}
	for i := range n {
		out = append(out, edit{'-', a0 + i, b0})
	}
	for j := range m {
		out = append(out, edit{'+', a0 + n, b0 + j})
	}
	return out
}

// backtrack walks the trace from (n, m) back to (0, 0) and appends the
// path's edits to out in order.
func backtrack(out []edit, trace [][]int32, n, m, a0, b0 int) []edit {
	var rev []edit
	x, y := n, m
	for d := len(trace) - 1; d >= 0; d-- {
		snap := trace[d]
		at := func(k int) int { return int(snap[k+d+1]) }
		k := x - y
		pk := k - 1
		if k == -d || (k != d && at(k-1) < at(k+1)) {
			pk = k + 1
		}
		px := at(pk)
		py := px - pk
		for x > px && y > py {
			x, y = x-1, y-1
			rev = append(rev, edit{' ', a0 + x, b0 + y})
		}
		if d == 0 {
			break
		}
		if x == px {
			y--
			rev = append(rev, edit{'+', a0 + x, b0 + y})
		} else {
			x--
			rev = append(rev, edit{'-', a0 + x, b0 + y})
		}
	}
	for i := len(rev) - 1; i >= 0; i-- {
		out = append(out, rev[i])
	}
	return out
}

// unified renders edits as hunks with contextLines of context.
func unified(x, y []string, edits []edit) string {
	var sb strings.Builder
	prevEnd := 0
	for i := 0; i < len(edits); {
		for i < len(edits) && edits[i].op == ' ' {
			i++
		}
		if i == len(edits) {
			break
		}
		start := max(i-contextLines, prevEnd)
		end := i
		for {
			for end < len(edits) && edits[end].op != ' ' {
				end++
			}
			run := end
			for run < len(edits) && edits[run].op == ' ' {
				run++
			}
			if run < len(edits) && run-end <= 2*contextLines {
				end = run
				continue
			}
			end = min(end+contextLines, run)
			break
		}
		writeHunk(&sb, x, y, edits[start:end])
		i, prevEnd = end, end
	}
	return sb.String()
}

func writeHunk(sb *strings.Builder, x, y []string, h []edit) {
	na, nb := 0, 0
	for _, e := range h {
		switch e.op {
		case ' ':
			na, nb = na+1, nb+1
		case '-':
			na++
		case '+':
			nb++
		}
	}
	sb.WriteString("@@ -")
	sb.WriteString(hunkRange(h[0].a, na))
	sb.WriteString(" +")
	sb.WriteString(hunkRange(h[0].b, nb))
	sb.WriteString(" @@\n")
	for _, e := range h {
		var line string
		if e.op == '+' {
			line = y[e.b]
		} else {
			line = x[e.a]
		}
		sb.WriteByte(e.op)
		sb.WriteString(line)
		if !strings.HasSuffix(line, "\n") {
			sb.WriteString("\n\\ No newline at end of file\n")
		}
	}
}

// hunkRange is a hunk's start and length in one document: the 1-based
// first line, or for an empty range the line after which it sits; the
// length is left out when it is 1.
func hunkRange(pos, n int) string {
	switch n {
	case 0:
		return strconv.Itoa(pos) + ",0"
	case 1:
		return strconv.Itoa(pos + 1)
	}
	return strconv.Itoa(pos+1) + "," + strconv.Itoa(n)
}
