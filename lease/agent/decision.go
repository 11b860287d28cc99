package agent

import "time"

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
	// Limit is the deciding rule's limit in tokens per Period.
	Limit int64
	// Period is the deciding rule's refill period.
	Period time.Duration
	// Remaining estimates the tokens the deciding rule's key has left: the
	// agent's live leased tokens plus what the region's bucket held at the
	// last grant, at most Limit. Other agents spend from the same region,
	// so it is a hint for headers, not a promise.
	Remaining int64
	// Reset estimates how long until the key's quota is whole again: the
	// time the rule's rate needs to refill Limit − Remaining tokens.
	Reset time.Duration
	// RetryAfter is, for a denial, how long to wait before trying again;
	// zero when allowed.
	RetryAfter time.Duration
	// Rule is the name of the deciding rule; "" when no rule matched.
	Rule string
	// Path is the part of the agent that decided.
	Path Path
}
