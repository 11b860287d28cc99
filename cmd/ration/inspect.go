package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"strconv"
	"strings"

	"github.com/ration-dev/ration/internal/adminapi"
	"github.com/ration-dev/ration/policy"
)

var inspectCmd = &command{
	name: "inspect", args: "RULE/KEY | -rule RULE KEY", minArgs: 1, maxArgs: 1, admin: true,
	summary: "show one key in every region: its bucket, each region's share and demand, report ages, recent counts",
	flags: func(fs *flag.FlagSet, c *cli) {
		fs.StringVar(&c.rule, "rule", "", "the key's rule: KEY is then the key as the rule forms it")
	},
	run: runInspect,
}

// shareTolerance is how far two regions' views of a share may differ
// before inspect marks them: the precision the table prints (0.1%) halved.
const shareTolerance = 0.0005

// inspectJSON is inspect's -o json: every region's answer in the order of
// -admin, and the errors of those that gave none, by address.
type inspectJSON struct {
	StoreKey string            `json:"store_key"`
	Regions  []keyJSON         `json:"regions"`
	Errors   map[string]string `json:"errors"`
	Exit     int               `json:"exit"`
}

// keyJSON is one region's answer and the address that gave it.
type keyJSON struct {
	Admin string `json:"admin"`
	adminapi.Key
}

// storeKeyArg is the store key of inspect's arguments.
func storeKeyArg(rule, arg string) (string, error) {
	if rule != "" {
		if strings.Contains(rule, "/") {
			return "", usageErrorf("-rule %q: a rule's name has no slash", rule)
		}
		return policy.StoreKey(rule, arg), nil
	}
	if r, k, ok := policy.SplitStoreKey(arg); !ok || r == "" || k == "" {
		return "", usageErrorf("KEY %q: want RULE/KEY (per-tenant/acme), or -rule RULE KEY", arg)
	}
	return arg, nil
}

func runInspect(c *cli, args []string) error {
	sk, err := storeKeyArg(c.rule, args[0])
	if err != nil {
		return err
	}
	ac, err := c.adminClient()
	if err != nil {
		return err
	}
	as := fetch(c.ctx, ac, adminapi.PathKey+url.PathEscape(sk), nil, func(k *adminapi.Key) error {
		if err := regionOf(k.Region); err != nil {
			return err
		}
		if k.StoreKey != sk {
			return fmt.Errorf("%w: it is about key %q, not %q", errNotJSON, k.StoreKey, sk)
		}
		return nil
	})
	errs, code := errorsOf(as)
	out := inspectJSON{StoreKey: sk, Regions: []keyJSON{}, Errors: errs, Exit: code}
	for _, a := range as {
		if a.err == nil {
			out.Regions = append(out.Regions, keyJSON{Admin: a.t.addr, Key: a.v})
		}
	}
	if c.json() {
		c.writeJSON(out)
	} else {
		if len(out.Regions) > 0 {
			writeInspect(c.stdout, out)
		}
		c.reportErrors(addrsOf(as), errs)
	}
	return finish(code)
}

// writeInspect prints inspect's table: a row per region that answered
// (and per region only the exchange named), its bucket beside the
// exchange's view of its share and demand, then the notes.
func writeInspect(w io.Writer, out inspectJSON) {
	ks := out.Regions
	first := ks[0].Key
	fmt.Fprintf(w, "%s: rule %s, %s %s, %d per %s\n", out.StoreKey, first.Rule, first.Scope, first.Algorithm, first.Limit, period(first.Period))
	var notes []string
	if q := quotas(ks); q != "" {
		notes = append(notes, "the regions enforce different quotas (the stricter holds while they disagree): "+q)
	}

	// The view shown is the first exchange's in the order of -admin; the
	// others are compared with it.
	var view *keyJSON
	for i := range ks {
		if ks[i].Exchange != nil {
			view = &ks[i]
			break
		}
	}
	differ := map[string]bool{}
	if view != nil {
		fmt.Fprintf(w, "exchange: as %s (%s) hears it", view.Region, view.Replica)
		switch {
		case view.Exchange.Held:
			fmt.Fprint(w, "; held (regions define the rule differently: shares stay where they are)")
		case view.Exchange.Resting:
			fmt.Fprint(w, "; resting (nothing planned for two epochs)")
		}
		fmt.Fprintln(w)
		notes = append(notes, viewDiffs(view, ks, differ)...)
	} else if first.Scope == "global" {
		notes = append(notes, "no answer carried the exchange's view: ask a region's holder replica (ration status shows it)")
	}
	fmt.Fprintln(w)

	t := newTable(w, "REGION", "REPLICA", "TOKENS/CAP", "RATE/s", "APPLIED", "SHARE", "DEMAND/s", "REPORT AGE", "ADMITTED", "DENIED", "DRY")
	shown := map[string]bool{}
	for _, k := range ks {
		shown[k.Region] = true
		cells := []string{k.Region, k.Replica, "-", "-", "-"}
		if b := k.Bucket; b != nil {
			cells = []string{k.Region, k.Replica, num(b.Tokens) + "/" + num(b.Capacity), num(b.Rate), pct(b.Share)}
		} else {
			notes = append(notes, k.Region+": no bucket in the store (never leased, or expired)")
		}
		cells = append(cells, viewCells(view, k.Region, differ)...)
		if k.Recent.Tracked {
			cells = append(cells, strconv.FormatUint(k.Recent.Admitted, 10), strconv.FormatUint(k.Recent.Denied, 10))
		} else {
			cells = append(cells, "-", "-")
			notes = append(notes, fmt.Sprintf("%s: too few requests in the last %s to be tracked", k.Region, seconds(k.Recent.Window)))
		}
		dry := "-"
		if k.DryFor > 0 {
			dry = seconds(k.DryFor)
		}
		t.row(append(cells, dry)...)
		if k.Note != "" {
			notes = append(notes, k.Region+": "+k.Note)
		}
	}
	if view != nil {
		for _, rs := range view.Exchange.Regions {
			if !shown[rs.Region] {
				t.row(append([]string{rs.Region, "-", "-", "-", "-"}, append(viewCells(view, rs.Region, differ), "-", "-", "-")...)...)
			}
		}
	}
	t.flush()
	if first.Recent.Window > 0 {
		notes = append([]string{fmt.Sprintf("ADMITTED and DENIED: tokens over the last %s", seconds(first.Recent.Window))}, notes...)
	}
	writeNotes(w, notes)
}

// viewCells are the share, demand and report age of region in view.
func viewCells(view *keyJSON, region string, differ map[string]bool) []string {
	if view == nil {
		return []string{"-", "-", "-"}
	}
	for _, rs := range view.Exchange.Regions {
		if rs.Region == region {
			s := pct(rs.Share)
			if differ[region] {
				s += "*"
			}
			age := seconds(rs.ReportAge)
			if rs.Self {
				age = "self"
			}
			return []string{s, num(rs.Demand), age}
		}
	}
	return []string{"-", "-", "-"}
}

// viewDiffs compares every other region's exchange view with view's; it
// marks in differ the regions whose share they see otherwise, and returns
// a note per differing view.
func viewDiffs(view *keyJSON, ks []keyJSON, differ map[string]bool) []string {
	base := map[string]float64{}
	for _, rs := range view.Exchange.Regions {
		base[rs.Region] = rs.Share
	}
	var notes []string
	for i := range ks {
		k := &ks[i]
		if k == view || k.Exchange == nil {
			continue
		}
		var diffs []string
		for _, rs := range k.Exchange.Regions {
			b, ok := base[rs.Region]
			if !ok || math.Abs(b-rs.Share) > shareTolerance {
				differ[rs.Region] = true
				diffs = append(diffs, rs.Region+" "+pct(rs.Share))
			}
		}
		if len(diffs) > 0 {
			notes = append(notes, fmt.Sprintf("* views differ: %s (%s) hears %s", k.Region, k.Replica, strings.Join(diffs, ", ")))
		}
	}
	return notes
}

// quotas lists each region's quota when they are not all the same, else
// "".
func quotas(ks []keyJSON) string {
	q := func(k adminapi.Key) string {
		return fmt.Sprintf("%s %s %d per %s", k.Scope, k.Algorithm, k.Limit, period(k.Period))
	}
	same := true
	for _, k := range ks[1:] {
		same = same && q(k.Key) == q(ks[0].Key)
	}
	if same {
		return ""
	}
	var parts []string
	for _, k := range ks {
		parts = append(parts, k.Region+": "+q(k.Key))
	}
	return strings.Join(parts, "; ")
}
