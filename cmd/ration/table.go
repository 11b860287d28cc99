package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// table writes rows aligned in columns, two spaces apart, with no escape
// sequences: the same on a terminal, in a pipe and in a test.
type table struct {
	tw *tabwriter.Writer
}

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() { _ = t.tw.Flush() }

// pct is a share (0..1) in percent, one decimal.
func pct(share float64) string {
	return strconv.FormatFloat(share*100, 'f', 1, 64) + "%"
}

// num is a rate or a number of tokens: one decimal at most.
func num(v float64) string {
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}

// seconds is a duration given in seconds, as an age or a window: tenths
// below ten seconds, then whole seconds, minutes and hours ("42s",
// "1m", "2m05s", "1h02m"); "never" when negative.
func seconds(s float64) string {
	switch {
	case s < 0:
		return "never"
	case s < 10:
		return strconv.FormatFloat(s, 'f', 1, 64) + "s"
	}
	n := int64(math.Round(s))
	h, m, sec := n/3600, n/60%60, n%60
	switch {
	case h > 0:
		return fmt.Sprintf("%dh%02dm", h, m)
	case sec == 0:
		return fmt.Sprintf("%dm", m)
	case m > 0:
		return fmt.Sprintf("%dm%02ds", m, sec)
	}
	return fmt.Sprintf("%ds", sec)
}

// period is a rule's period: "1s", "1m0s".
func period(s float64) string {
	return time.Duration(s * float64(time.Second)).String()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// writeNotes prints the notes under a table.
func writeNotes(w io.Writer, notes []string) {
	if len(notes) == 0 {
		return
	}
	fmt.Fprintln(w, "\nnotes:")
	for _, n := range notes {
		fmt.Fprintln(w, "  "+n)
	}
}
