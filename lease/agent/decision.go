package agent

import (
	"strconv"
	"time"

	"github.com/ration-dev/ration/policy"
)

// Path says which part of the agent made a decision. Every Decision carries
// one, and the decision metrics are labelled with it.
type Path uint8

const (
	// PathNone: no rule matched the request, so it was allowed and nothing
	// was spent (also the answer before the first policy arrives).
	PathNone Path = iota
	// PathLease: decided by leased tokens, spent locally or fetched with a
	// synchronous round trip; a denial on this path means the region had no
	// tokens to grant.
	PathLease
	// PathDenyCache: denied locally because the region recently granted the
	// key nothing (or only part of what it asked for) and its retry time has
	// not come yet.
	PathDenyCache
	// PathFallbackLocal: the region could not be reached and the rule's
	// on_error is local: decided by the key's emergency bucket.
	PathFallbackLocal
	// PathFailedOpen: the region could not be reached and the rule's
	// on_error is open: admitted without a limit.
	PathFailedOpen
	// PathFailedClosed: the region could not be reached and the rule's
	// on_error is closed: denied (503 semantics, not 429).
	PathFailedClosed
	// PathShadow: every enforced rule allowed, but a shadow rule would have
	// denied. The request is allowed; the Decision describes the shadow rule.
	PathShadow

	numPaths
)

var pathNames = [numPaths]string{"NONE", "LEASE", "DENY_CACHE", "FALLBACK_LOCAL", "FAILED_OPEN", "FAILED_CLOSED", "SHADOW"}

// String returns the path's name as the design spells it (LEASE, DENY_CACHE, ...).
func (p Path) String() string {
	if p < numPaths {
		return pathNames[p]
	}
	return "UNKNOWN"
}

// Decision is the answer to one Allow. The quota fields describe the rule
// that decided: the one that denied, or, when the request was allowed, the
// tightest rule (least remaining relative to its limit), so that response
// headers warn about the quota closest to running out.
type Decision struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Limit is the deciding rule's limit in tokens per Period (per window
	// for a fixed window).
	Limit int64
	// Period is the deciding rule's refill period. For a fixed window it
	// is the length of the window containing now, which for calendar
	// windows is the real one: 23 or 25 hours on a day with a DST change,
	// 28 to 31 days for a month (Window has the nominal length).
	Period time.Duration
	// Window describes the deciding rule's windows when it is a fixed
	// window; the zero Window for a token bucket.
	Window Window
	// Remaining estimates the tokens the deciding rule's key has left: the
	// agent's live leased tokens plus what the region's bucket held at the
	// last grant, at most Limit. Other agents spend from the same region,
	// so it is a hint for headers, not a promise.
	Remaining int64
	// Reset estimates how long until the key's quota is whole again: for a
	// token bucket, the time the rule's rate needs to refill Limit −
	// Remaining tokens; for a fixed window, the time to the end of the
	// window containing now (by the agent's clock), allowed or not.
	Reset time.Duration
	// RetryAfter is, for a denial, how long to wait before trying again;
	// zero when allowed. A fixed window that has no token left for the
	// request says the time to its end: the next window is whole then.
	// Tokens may come back sooner (given back by other agents, or by other
	// regions with share), and the agent admits them to whoever asks, but
	// they are not promised.
	RetryAfter time.Duration
	// Rule is the name of the deciding rule; "" when no rule matched.
	Rule string
	// Path is the part of the agent that decided.
	Path Path
}

// Quota describes the deciding rule's quota for messages: "1000 per day",
// "100 per 1m0s window" for fixed windows, "1000 per 10m0s" for a token
// bucket.
func (d Decision) Quota() string {
	if d.Window.Fixed() {
		return strconv.FormatInt(d.Limit, 10) + " per " + d.Window.String()
	}
	return strconv.FormatInt(d.Limit, 10) + " per " + d.Period.String()
}

// Window describes how a fixed-window rule cuts time: into calendar days,
// weeks (from Monday) or months of the rule's time zone, or into windows of
// Length counted from local midnight (policy.Rule.Window). The zero Window
// is a token bucket's, which has no windows.
type Window struct {
	// Calendar is policy.CalendarDay, CalendarWeek or CalendarMonth for
	// calendar windows (a period of 24h is a day); "" for windows of
	// Length.
	Calendar policy.Calendar
	// Length is the rule's period, the windows' nominal length:
	// policy.NominalDay, NominalWeek or NominalMonth for calendar windows.
	// Zero for a token bucket.
	Length time.Duration
}

// Fixed reports whether w describes a fixed window.
func (w Window) Fixed() bool { return w.Length > 0 }

// String names the windows as the unit of a quota: "day", "week", "month",
// or "1m0s window"; "" for a token bucket.
func (w Window) String() string {
	switch {
	case w.Calendar != "":
		return string(w.Calendar)
	case w.Length > 0:
		return w.Length.String() + " window"
	}
	return ""
}
