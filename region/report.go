package region

import (
	"fmt"
	"time"
)

// Report is one replica's usage report for one epoch: what sync/ puts on the
// wire. Every counter in it is cumulative or absolute, so a lost report costs
// one epoch of freshness and a duplicated or reordered one changes nothing.
type Report struct {
	// Region and Replica name the sender.
	Region, Replica string
	// Epoch is the sender's epoch number: floor(SentAt / Period), and at
	// least one more than the sender's previous epoch. Receivers ignore a
	// report not newer than the last one from the same replica (ErrStale).
	Epoch uint64
	// SentAt is the sender's clock at the epoch, for lag metrics only.
	SentAt time.Time
	// Exchange is true when the sender runs its region's exchange (it holds
	// the region's exchange lease): its entries carry generations, rows and
	// exit records, and a key it leaves out has no exchange state there (in
	// a delta, a key of a bucket it refreshes; see Refresh). A report with
	// Exchange false carries demand tallies only.
	Exchange bool
	// Regions is the sender's Config.Regions: the index of every Row,
	// Taken, In and InTaken in the report. Receivers map columns by name, so
	// regions with different region sets (a rolling change) still exchange;
	// a column for a region the receiver does not know is ignored.
	Regions []string
	// Refresh is 0 in a full report: a key it leaves out has no state and no
	// demand at the sender. A delta report (Refresh > 0) lists the keys that
	// changed since the sender's previous report of its kind, and every key
	// of the refresh buckets RefreshFrom to RefreshFrom + RefreshCount - 1
	// (mod RefreshBuckets; a key's bucket is RefreshBucket): a key of those
	// buckets it leaves out has no state (or no demand) there. The sender
	// covers every bucket at least once every Refresh epochs
	// (docs/DESIGN.md, "Reports are deltas").
	Refresh                   uint32
	RefreshFrom, RefreshCount uint32
	// Since is, in a delta report, the epoch of the report that started the
	// sender's stream of deltas: listings older than it are void (the
	// sender restarted, or another replica took the exchange over). 0 in a
	// full report.
	Since uint64
	// Prev is, in a delta report, the epoch of the sender's previous report
	// of its kind in the stream (0 for the first): a receiver that did not
	// get that one missed a delta, and asks for it again (Resend).
	Prev uint64
	// Resent is, in a delta report, nonzero when the report also lists
	// every key whose entry changed since that epoch: the answer to a
	// Resend.
	Resent uint64
	// Resend are the streams whose reports the sender missed, each as
	// ResendRequest.String: the senders named list again what changed
	// since.
	Resend []string
	// Policy names the policy the sender enforces (its revision or
	// version, for logs), and Rules are its global rules' definitions
	// (Config.Rules): a receiver holds the keys of a rule it defines
	// otherwise (Disagreements). Policy "" (a sender that predates them)
	// says nothing of its rules.
	Policy string
	Rules  []RuleDef
	// Keys are the sender's active keys; in a delta report, those that
	// changed and those refreshed. An entry with no exchange state and no
	// tallies says the key has none there (any more).
	Keys []KeyReport
}

// KeyReport is one key in a Report.
type KeyReport struct {
	// Key is the global key identity: the key's store key
	// (policy.StoreKey), an opaque string here.
	Key string
	// Generation is the generation of the sender's exchange state for the
	// key, 0 when it has none (a tally-only entry, or a region that has
	// retired the key and still announces its Exit).
	Generation uint64
	// Base is the sender's share when it entered Generation, in ppm, plus
	// what it took back from (or gave up to) regions that left Generation
	// without applying it: with the rows, it gives the sender's share.
	Base int64
	// Row is G[sender][j]: the share the sender has given to region j in
	// Generation, cumulative, in ppm. Empty when Generation is 0.
	Row []int64
	// Taken is R[sender][j]: the share the sender has reclaimed from a
	// silent region j in Generation. Nil when all zero.
	Taken []int64
	// In and InTaken are G[j][sender] and R[j][sender] as the sender has
	// applied them in Generation: acknowledgements, which tell a giver
	// that its gift arrived (a region retires a key only when its gifts
	// are acknowledged, so that retiring loses nothing). Nil when all zero.
	In, InTaken []int64
	// Tokens is the sender's row of tokens given with share: TG[sender][j],
	// cumulative in Generation and, for a fixed-window key, in the window
	// starting at TokensWindow (Unix µs; 0 for a token bucket), in
	// TokenScale units. Nil when all zero.
	Tokens       []int64
	TokensWindow int64
	// SharePPM is the sender region's applied share.
	SharePPM int64
	// Demand is the tokens asked for in the epoch at this replica,
	// admitted or not; Granted the tokens granted. Receivers sum them over
	// the replicas of a region.
	Demand, Granted int64
	// Exits are the sender's final states in generations it left and
	// still announces, oldest first (see Exit).
	Exits []Exit
	// Settled[j] is the newest generation of region j's exit records the
	// sender has settled against: an acknowledgement, so that j stops
	// announcing them. Nil unless some region announces exits.
	Settled []uint64
}

// Exit is a region's final state in a generation it has left (by moving to a
// newer one or by retiring the key). It is final: a region never gives,
// reclaims or receives again in a generation it has left, so its peers can
// settle against it.
type Exit struct {
	// Generation is the generation left.
	Generation uint64
	// Row and Taken are the leaver's final G and R rows in it.
	Row, Taken []int64
	// In and InTaken are the gifts and reclaims the leaver had applied
	// from each region when it left: a giver takes back what it gave beyond
	// In (nobody will ever use it), and a reclaimer gives up what it took
	// beyond InTaken. Taken holds only the reclaims the victims had
	// acknowledged: a reclaimer that moves on gives up the others.
	In, InTaken []int64
}

// columns maps the column indexes of a report's rows to the receiver's
// region indexes (-1 for regions the receiver does not know).
func (s *State) columns(regions []string) []int {
	if len(regions) == s.n {
		same := true
		for i, r := range regions {
			if r != s.cfg.Regions[i] {
				same = false
				break
			}
		}
		if same {
			return s.identity
		}
	}
	m := make([]int, len(regions))
	for i, r := range regions {
		j, ok := s.index[r]
		if !ok {
			j = -1
		}
		m[i] = j
	}
	return m
}

// checkShape validates everything in r that does not depend on the
// receiver's state. It returns the sender's column in r.Regions.
func checkShape(r *Report) (int, error) {
	if r.Region == "" || r.Replica == "" {
		return -1, badReport(r, "empty region or replica name")
	}
	if len(r.Regions) > maxRegions {
		return -1, badReport(r, "%d regions, more than %d", len(r.Regions), maxRegions)
	}
	self := -1
	for i, name := range r.Regions {
		if name == "" || (i > 0 && r.Regions[i-1] >= name) {
			return -1, badReport(r, "Regions not sorted without duplicates at %d", i)
		}
		if name == r.Region {
			self = i
		}
	}
	if r.Refresh > maxRefresh || (r.Refresh == 0) != (r.Since == 0) || r.Since > r.Epoch ||
		r.RefreshFrom >= RefreshBuckets || r.RefreshCount > RefreshBuckets || (r.Refresh == 0 && r.RefreshFrom+r.RefreshCount != 0) {
		return -1, badReport(r, "Refresh %d, RefreshFrom %d, RefreshCount %d and Since %d", r.Refresh, r.RefreshFrom, r.RefreshCount, r.Since)
	}
	if (r.Refresh == 0 && (r.Prev != 0 || r.Resent != 0)) || r.Prev >= r.Epoch && r.Prev != 0 || r.Resent > r.Epoch || len(r.Resend) > maxResend {
		return -1, badReport(r, "Prev %d, Resent %d, %d Resend", r.Prev, r.Resent, len(r.Resend))
	}
	for _, q := range r.Resend {
		if _, err := ParseResendRequest(q); err != nil {
			return -1, badReport(r, "%v", err)
		}
	}
	if err := checkRules(r); err != nil {
		return -1, err
	}
	if r.Exchange && self < 0 {
		return -1, badReport(r, "sender region %q not in its own Regions", r.Region)
	}
	for i := range r.Keys {
		if err := checkKeyShape(r, i, self); err != nil {
			return -1, err
		}
	}
	return self, nil
}

// badReport is the error for a malformed report r.
func badReport(r *Report, format string, args ...any) error {
	return fmt.Errorf("%w: report from %q/%q epoch %d: %s", ErrMalformed, r.Region, r.Replica, r.Epoch, fmt.Sprintf(format, args...))
}

// checkKeyShape decides whether entry i of r is well formed (self is the sender's column).
func checkKeyShape(r *Report, i, self int) error {
	k := &r.Keys[i]
	n := len(r.Regions)
	switch {
	case k.Key == "":
		return badReport(r, "key %d has an empty name", i)
	case len(k.Settled) != 0 && len(k.Settled) != n:
		return badReport(r, "key %q: Settled has %d columns, want %d", k.Key, len(k.Settled), n)
	case k.Demand < 0 || k.Granted < 0:
		return badReport(r, "key %q: negative tallies", k.Key)
	case k.SharePPM < 0 || k.SharePPM > PPM:
		return badReport(r, "key %q: SharePPM %d not in [0, %d]", k.Key, k.SharePPM, PPM)
	case k.Base < -PPM || k.Base > PPM:
		return badReport(r, "key %q: Base %d not in [%d, %d]", k.Key, k.Base, -PPM, PPM)
	case k.TokensWindow < 0 || k.TokensWindow > maxCounter || (k.TokensWindow != 0 && k.Generation == 0):
		return badReport(r, "key %q: TokensWindow %d", k.Key, k.TokensWindow)
	}
	if !r.Exchange {
		if k.Generation != 0 || len(k.Row) != 0 || len(k.Taken) != 0 || len(k.In) != 0 || len(k.InTaken) != 0 || len(k.Tokens) != 0 || len(k.Exits) != 0 || len(k.Settled) != 0 || k.Base != 0 {
			return badReport(r, "key %q: exchange state in a tally-only report", k.Key)
		}
		return nil
	}
	if k.Generation == 0 {
		if len(k.Row) != 0 || len(k.Taken) != 0 || len(k.In) != 0 || len(k.InTaken) != 0 || len(k.Tokens) != 0 || k.Base != 0 {
			return badReport(r, "key %q: rows without a generation", k.Key)
		}
	} else if err := checkKeyRows(r, k, self); err != nil {
		return err
	}
	if len(k.Exits) == 0 {
		return nil // most entries: spare them the call
	}
	return checkExitsShape(r, k)
}

// checkKeyRows decides whether an entry's rows are in range and give nothing to the sender (self).
func checkKeyRows(r *Report, k *KeyReport, self int) error {
	n := len(r.Regions)
	switch { // Row is required; Taken, In and InTaken may be empty
	case !rowOK(k.Row, n):
		return badRow(r, k, "Row", k.Row)
	case len(k.Taken) > 0 && !rowOK(k.Taken, n):
		return badRow(r, k, "Taken", k.Taken)
	case len(k.In) > 0 && !rowOK(k.In, n):
		return badRow(r, k, "In", k.In)
	case len(k.InTaken) > 0 && !rowOK(k.InTaken, n):
		return badRow(r, k, "InTaken", k.InTaken)
	case len(k.Tokens) > 0 && !rowOK(k.Tokens, n):
		return badRow(r, k, "Tokens", k.Tokens)
	}
	if k.Row[self] != 0 || (len(k.Taken) > 0 && k.Taken[self] != 0) || (len(k.Tokens) > 0 && k.Tokens[self] != 0) {
		return badReport(r, "key %q: a region gives to itself", k.Key)
	}
	return nil
}

// checkExitsShape decides whether an entry's exit records are in order and in range.
func checkExitsShape(r *Report, k *KeyReport) error {
	n := len(r.Regions)
	for x := range k.Exits {
		e := &k.Exits[x]
		if e.Generation == 0 || (k.Generation != 0 && e.Generation >= k.Generation) || (x > 0 && e.Generation <= k.Exits[x-1].Generation) {
			return badReport(r, "key %q: exit of generation %d, current %d", k.Key, e.Generation, k.Generation)
		}
		switch { // Row and In are required; Taken and InTaken may be empty
		case !rowOK(e.Row, n):
			return badRow(r, k, "Exit.Row", e.Row)
		case len(e.Taken) > 0 && !rowOK(e.Taken, n):
			return badRow(r, k, "Exit.Taken", e.Taken)
		case !rowOK(e.In, n):
			return badRow(r, k, "Exit.In", e.In)
		case len(e.InTaken) > 0 && !rowOK(e.InTaken, n):
			return badRow(r, k, "Exit.InTaken", e.InTaken)
		}
	}
	return nil
}

// rowOK reports whether row v has n columns, each in [0, maxCounter]; small enough to inline.
func rowOK(v []int64, n int) bool {
	if len(v) != n {
		return false
	}
	for _, x := range v {
		if x < 0 || x > maxCounter {
			return false
		}
	}
	return true
}

// badRow is the error for row v of entry k, which rowOK rejected.
func badRow(r *Report, k *KeyReport, what string, v []int64) error {
	if n := len(r.Regions); len(v) != n {
		return badReport(r, "key %q: %s has %d columns, want %d", k.Key, what, len(v), n)
	}
	for j, x := range v {
		if x < 0 || x > maxCounter {
			return badReport(r, "key %q: %s[%d] = %d out of range", k.Key, what, j, x)
		}
	}
	return nil // not reached: rowOK rejected v
}

// maxCounter bounds a cumulative counter. Counters grow by at most PPM per
// epoch per region, so 2^53 lasts longer than any deployment and keeps sums
// of n counters far from overflow.
const maxCounter = 1 << 53
