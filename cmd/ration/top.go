package main

import (
	"cmp"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/ration-dev/ration/internal/adminapi"
)

var topCmd = &command{
	name: "top", args: "[-rule RULE] [-by denied|demand] [-n N]", minArgs: 0, maxArgs: 0, admin: true,
	summary: "list the keys with the most denied tokens (or demand) over the recent window, summed over the regions",
	flags: func(fs *flag.FlagSet, c *cli) {
		fs.StringVar(&c.rule, "rule", "", "only the keys of this rule (default: every rule)")
		fs.StringVar(&c.by, "by", "denied", "rank by denied tokens or by demand")
		fs.IntVar(&c.n, "n", 10, "how many keys, 1 to 1000")
	},
	run: runTop,
}

// maxTop bounds top's -n.
const maxTop = 1000

// topJSON is top's -o json: the merged ranking, then each region's answer
// as it came (in the order of -admin) and the errors by address.
type topJSON struct {
	By      string            `json:"by"`
	Rule    string            `json:"rule,omitempty"`
	N       int               `json:"n"`
	Keys    []mergedKey       `json:"keys"`
	Regions []topRegionJSON   `json:"regions"`
	Errors  map[string]string `json:"errors"`
	Exit    int               `json:"exit"`
}

type topRegionJSON struct {
	Admin string `json:"admin"`
	adminapi.Top
}

// mergedKey is one key of the ranking, summed over the regions (Error,
// the sum of the regions' errors, bounds the overcount).
type mergedKey struct {
	Rank int `json:"rank"`
	adminapi.TopKey
	// Regions is the count in each region whose top holds the key, by
	// the column's label (the region, or region/replica when one region
	// answered twice).
	Regions map[string]uint64 `json:"regions"`
}

func runTop(c *cli, _ []string) error {
	switch {
	case c.by != "denied" && c.by != "demand":
		return usageErrorf("-by must be denied or demand (got %q)", c.by)
	case c.n < 1 || c.n > maxTop:
		return usageErrorf("-n must be 1 to %d (got %d)", maxTop, c.n)
	}
	ac, err := c.adminClient()
	if err != nil {
		return err
	}
	q := url.Values{"by": {c.by}, "n": {strconv.Itoa(c.n)}}
	if c.rule != "" {
		q.Set("rule", c.rule)
	}
	as := fetch(c.ctx, ac, adminapi.PathTop, q, func(t *adminapi.Top) error {
		if err := regionOf(t.Region); err != nil {
			return err
		}
		if t.By != c.by {
			return fmt.Errorf("%w: it ranks by %q, not %q", errNotJSON, t.By, c.by)
		}
		return nil
	})
	errs, code := errorsOf(as)
	out := topJSON{By: c.by, Rule: c.rule, N: c.n, Regions: []topRegionJSON{}, Errors: errs, Exit: code}
	for _, a := range as {
		if a.err == nil {
			out.Regions = append(out.Regions, topRegionJSON{Admin: a.t.addr, Top: a.v})
		}
	}
	out.Keys = mergeTop(out.Regions, c.n)
	if c.json() {
		c.writeJSON(out)
	} else {
		if len(out.Regions) > 0 {
			writeTop(c.stdout, out)
		}
		c.reportErrors(addrsOf(as), errs)
	}
	return finish(code)
}

// labels names each answer's column: its region, or region/replica when
// two answers come from one region.
func labels(ts []topRegionJSON) []string {
	n := map[string]int{}
	for _, t := range ts {
		n[t.Region]++
	}
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Region
		if n[t.Region] > 1 {
			out[i] += "/" + t.Replica
		}
	}
	return out
}

// mergeTop sums the regions' tops by store key and keeps the n largest
// counts (ties by store key).
func mergeTop(ts []topRegionJSON, n int) []mergedKey {
	byKey := map[string]*mergedKey{}
	for i, label := range labels(ts) {
		for _, k := range ts[i].Keys {
			m := byKey[k.StoreKey]
			if m == nil {
				m = &mergedKey{TopKey: adminapi.TopKey{StoreKey: k.StoreKey, Rule: k.Rule, Key: k.Key}, Regions: map[string]uint64{}}
				byKey[k.StoreKey] = m
			}
			m.Count += k.Count
			m.Error += k.Error
			m.Admitted += k.Admitted
			m.Denied += k.Denied
			m.Regions[label] += k.Count
		}
	}
	out := make([]mergedKey, 0, len(byKey))
	for _, m := range byKey {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b mergedKey) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.StoreKey, b.StoreKey))
	})
	if len(out) > n {
		out = out[:n]
	}
	for i := range out {
		out[i].Rank = i + 1
	}
	return out
}

// writeTop prints top's table and its notes.
func writeTop(w io.Writer, out topJSON) {
	ls := labels(out.Regions)
	rule := "every rule"
	if out.Rule != "" {
		rule = "rule " + out.Rule
	}
	var windows []string
	for _, r := range out.Regions {
		if s := seconds(r.Window); !slices.Contains(windows, s) {
			windows = append(windows, s)
		}
	}
	fmt.Fprintf(w, "top %d by %s over the last %s, %s, from %s\n\n", out.N, out.By, strings.Join(windows, "/"), rule, strings.Join(ls, ", "))
	if len(out.Keys) == 0 {
		fmt.Fprintln(w, "no keys")
		return
	}
	header := append([]string{"RANK", "STORE KEY", "RULE", "COUNT"}, ls...)
	t := newTable(w, append(header, "ADMITTED", "DENIED")...)
	var overcount, missing bool
	for _, k := range out.Keys {
		count := strconv.FormatUint(k.Count, 10)
		if k.Error > 0 {
			count += " ±" + strconv.FormatUint(k.Error, 10)
			overcount = true
		}
		cells := []string{strconv.Itoa(k.Rank), k.StoreKey, k.Rule, count}
		for _, l := range ls {
			if c, ok := k.Regions[l]; ok {
				cells = append(cells, strconv.FormatUint(c, 10))
			} else {
				cells = append(cells, "-")
				missing = true
			}
		}
		t.row(append(cells, strconv.FormatUint(k.Admitted, 10), strconv.FormatUint(k.Denied, 10))...)
	}
	t.flush()
	var notes []string
	if overcount {
		notes = append(notes, "± the summaries' estimates may exceed the true count by at most this much")
	}
	if missing {
		notes = append(notes, fmt.Sprintf("- not in that region's top %d: counted as 0", out.N))
	}
	writeNotes(w, notes)
}
