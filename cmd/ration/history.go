package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ration-dev/ration/policy/kvstore"
)

var historyCmd = &command{
	name: "history", args: "[-n N] [-v]", minArgs: 0, maxArgs: 0,
	summary: "the kept revisions, newest first: time, op, author, message (and diff with -v)",
	flags: func(fs *flag.FlagSet, c *cli) {
		fs.IntVar(&c.n, "n", 20, "show the last N revisions (0: every kept one)")
		fs.BoolVar(&c.verbose, "v", false, "show each revision's diff")
	},
	run: runHistory,
}

type historyJSON struct {
	Revisions []*revisionJSON `json:"revisions"`
}

func runHistory(c *cli, _ []string) error {
	if c.n < 0 {
		return usageErrorf("-n must be >= 0 (got %d)", c.n)
	}
	st, err := c.open(false, 0)
	if err != nil {
		return err
	}
	hist, err := st.History(c.ctx)
	if err != nil {
		return err
	}
	if c.n > 0 && len(hist) > c.n {
		hist = hist[len(hist)-c.n:]
	}
	slices.Reverse(hist)
	out := historyJSON{Revisions: []*revisionJSON{}}
	for _, r := range hist {
		out.Revisions = append(out.Revisions, toJSON(r, false))
	}
	c.emit(out, func(w io.Writer) {
		if len(hist) == 0 {
			fmt.Fprintln(w, "no revisions")
			return
		}
		if c.verbose {
			for _, r := range hist {
				fmt.Fprintf(w, "revision %d  %s  %s  %s  %s\n", r.Revision, timeOf(r), r.Key, opOf(r), authorOf(r))
				if r.Message != "" {
					fmt.Fprintf(w, "    %s\n", r.Message)
				}
				if r.Diff != "" {
					fmt.Fprintf(w, "\n%s", r.Diff)
				}
				fmt.Fprintln(w)
			}
			return
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "REV\tTIME\tKEY\tOP\tAUTHOR\tMESSAGE")
		for _, r := range hist {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", r.Revision, timeOf(r), r.Key, opOf(r), authorOf(r), oneLine(r.Message))
		}
		tw.Flush()
	})
	return nil
}

func timeOf(r kvstore.Revision) string { return r.Time.UTC().Format(time.RFC3339) }

// opOf is a revision's op, with the revision it copies or removes.
func opOf(r kvstore.Revision) string {
	if r.FromRevision != 0 {
		return r.Op + " " + strconv.FormatUint(r.FromRevision, 10)
	}
	return r.Op
}

func oneLine(s string) string {
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		return s[:i] + " …"
	}
	return s
}
