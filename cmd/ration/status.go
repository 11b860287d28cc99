package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/ration-dev/ration/internal/adminapi"
)

var statusCmd = &command{
	name: "status", args: "", minArgs: 0, maxArgs: 0, admin: true,
	summary: "show each region's health and how it hears the others; exit 1 if one is not ready, 3 if one cannot be asked",
	run:     runStatus,
}

// statusJSON is status's -o json: every region's answer in the order of
// -admin, and the errors of those that gave none, by address.
type statusJSON struct {
	Regions []statusRegionJSON `json:"regions"`
	Errors  map[string]string  `json:"errors"`
	Exit    int                `json:"exit"`
}

type statusRegionJSON struct {
	Admin string `json:"admin"`
	adminapi.Status
}

func runStatus(c *cli, _ []string) error {
	ac, err := c.adminClient()
	if err != nil {
		return err
	}
	as := fetch(c.ctx, ac, adminapi.PathStatus, nil, func(s *adminapi.Status) error { return regionOf(s.Region) })
	errs, code := errorsOf(as)
	out := statusJSON{Regions: []statusRegionJSON{}, Errors: errs}
	for _, a := range as {
		if a.err == nil {
			out.Regions = append(out.Regions, statusRegionJSON{Admin: a.t.addr, Status: a.v})
			if !a.v.Ready {
				// Not ready is the region's answer, as a refusal is:
				// 1, unless another region could not be asked (3).
				code = max(code, exitRefused)
			}
		}
	}
	out.Exit = code
	if c.json() {
		c.writeJSON(out)
	} else {
		if len(out.Regions) > 0 {
			writeStatus(c.stdout, out.Regions)
		}
		c.reportErrors(addrsOf(as), errs)
	}
	return finish(code)
}

// writeStatus prints the regions' table, the peers matrix and the notes.
func writeStatus(w io.Writer, ss []statusRegionJSON) {
	var notes []string
	t := newTable(w, "REGION", "REPLICA", "READY", "STORE", "POLICY", "HOLDER", "EPOCH", "KEYS/RESTING", "AGENTS", "UPTIME", "VERSION")
	for _, s := range ss {
		store := s.Store.Kind + " ok"
		if !s.Store.OK {
			store = s.Store.Kind + " failing"
			notes = append(notes, fmt.Sprintf("%s: store: %s", s.Region, s.Store.Error))
		}
		if !s.Ready {
			notes = append(notes, fmt.Sprintf("%s: not ready: %s", s.Region, s.NotReady))
		}
		pol := "-"
		if s.Policy.Revision > 0 || s.Policy.Version != "" {
			pol = fmt.Sprintf("r%d %s", s.Policy.Revision, s.Policy.Version)
		}
		if len(s.Policy.Stricter) > 0 {
			notes = append(notes, fmt.Sprintf("%s: enforces the stricter of its own and a peer's rule for %s", s.Region, strings.Join(s.Policy.Stricter, ", ")))
		}
		holder, epoch, keys := "-", "-", "-"
		if x := s.Exchange; x != nil {
			holder, epoch, keys = yesNo(x.Holder), strconv.FormatUint(x.Epoch, 10), fmt.Sprintf("%d/%d", x.Keys, x.Resting)
			if len(x.Disagreements) > 0 {
				notes = append(notes, fmt.Sprintf("%s: holds the shares of %s (a peer defines them otherwise)", s.Region, strings.Join(x.Disagreements, ", ")))
			}
		}
		version := s.Version
		if version == "" {
			version = "-"
		}
		t.row(s.Region, s.Replica, yesNo(s.Ready), store, pol, holder, epoch, keys, strconv.Itoa(s.Agents), seconds(s.Uptime), version)
	}
	t.flush()
	if policies := policyRevisions(ss); len(policies) > 1 {
		notes = append(notes, "the regions enforce different policy revisions: "+strings.Join(policies, ", "))
	}
	notes = append(notes, writePeers(w, ss)...)
	writeNotes(w, notes)
}

// policyRevisions lists the distinct revisions the regions enforce.
func policyRevisions(ss []statusRegionJSON) []string {
	var out []string
	for _, s := range ss {
		r := fmt.Sprintf("r%d %s", s.Policy.Revision, s.Policy.Version)
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// writePeers prints the matrix of report ages: a row per region that
// answered with an exchange, a column per region any of them names. It
// returns the notes that explain the marks it used.
func writePeers(w io.Writer, ss []statusRegionJSON) []string {
	var cols []string
	add := func(r string) {
		if !slices.Contains(cols, r) {
			cols = append(cols, r)
		}
	}
	// The regions that answered first, in the rows' order, so that the
	// diagonal reads "self"; then any peer only they name.
	peers := 0
	for _, s := range ss {
		if s.Exchange != nil {
			peers += len(s.Exchange.Peers)
			add(s.Region)
		}
	}
	for _, s := range ss {
		if s.Exchange != nil {
			for _, p := range s.Exchange.Peers {
				add(p.Region)
			}
		}
	}
	if peers == 0 {
		return nil
	}
	fmt.Fprintln(w, "\npeers: report age as each region (row) hears each other (column)")
	var never, stale, unknown bool
	t := newTable(w, append([]string{"HEARS"}, cols...)...)
	for _, s := range ss {
		if s.Exchange == nil {
			continue
		}
		cells := []string{s.Region}
		for _, col := range cols {
			cell := "self"
			if col != s.Region {
				cell = peerCell(s.Exchange.Peers, col, &never, &stale, &unknown)
			}
			cells = append(cells, cell)
		}
		t.row(cells...)
	}
	t.flush()
	var notes []string
	if stale {
		notes = append(notes, "* stale: older than the exchange's limit; the region plans without that peer")
	}
	if never {
		notes = append(notes, "- never heard")
	}
	if unknown {
		notes = append(notes, "? not a peer of that region: the regions are configured with different region lists")
	}
	return notes
}

// peerCell is how a region hears peer: its report age, "-" never, "?"
// not a peer; "*" marks a stale one.
func peerCell(peers []adminapi.Peer, peer string, never, stale, unknown *bool) string {
	i := slices.IndexFunc(peers, func(p adminapi.Peer) bool { return p.Region == peer })
	switch {
	case i < 0:
		*unknown = true
		return "?"
	case !peers[i].Heard || peers[i].ReportAge < 0:
		*never = true
		return "-"
	case peers[i].Stale:
		*stale = true
		return seconds(peers[i].ReportAge) + "*"
	}
	return seconds(peers[i].ReportAge)
}
