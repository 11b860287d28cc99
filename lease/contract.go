// Package lease is the regional allocator of ration: a token bucket per key
// from which agents lease pre-debited batches of tokens.
//
// The allocator contract (DESIGN.md, "Level 1") is implemented twice: by
// RedisStore, one atomic Lua script per key that reads Redis's own clock, and
// by MemoryStore, the same arithmetic in Go with the clock as an argument,
// used by the embedded default and the simulator. One conformance suite runs
// against both.
package lease

import (
	"errors"
	"time"

	"github.com/ration-dev/ration/region"
)

// Sentinel errors. Store methods wrap them with %w; match with errors.Is.
var (
	// ErrInvalid reports an argument that breaks the contract: a want or
	// cost that is not positive, a cost above the bucket's burst, a rate or
	// burst that is not a positive finite number, a share outside [0, region.PPM],
	// an empty key. Nothing is debited for an invalid item.
	ErrInvalid = errors.New("lease: invalid argument")
	// ErrUnavailable reports that the store could not be reached in time.
	ErrUnavailable = errors.New("lease: store unavailable")
)

// Limit is what the policy says about one key, passed with every call: the
// store keeps only the bucket's state and the key's applied share.
type Limit struct {
	// Rate is the key's global rate L in tokens per second.
	Rate float64
	// Burst is the key's global burst b in tokens.
	Burst float64
	// Cost is the rule's cost per request in tokens. A regional bucket's
	// capacity never falls below it, so one request can always be served
	// eventually; a Cost above Burst is invalid.
	Cost int64
	// InitialShare is the region's share in ppm used while the store holds
	// no applied share for the key (scope: region rules pass region.PPM).
	InitialShare int64
	// StartEmpty makes a missing bucket start empty instead of full (the
	// per-rule option that trades a short under-admission after a store
	// data loss for no excess).
	StartEmpty bool
	// Window makes the bucket a fixed window (the policy's fixed_window):
	// the window boundaries around the caller's clock in Unix µs, as
	// policy.Rule.Boundaries gives them (the previous window's start, the
	// current window's start and end, the next window's end). The store
	// uses the window its own clock is in: the bucket holds Burst × share,
	// does not refill within the window, is full again when the next one
	// starts, and vanishes at the end of its window. The zero value is a
	// token bucket.
	Window [4]int64
}

// Fixed reports whether l is a fixed window.
func (l Limit) Fixed() bool { return l.Window != [4]int64{} }

// Regional returns the regional bucket's rate (tokens/s) and capacity
// (tokens) for an applied share in ppm: rate = L × share,
// capacity = max(b × share, cost).
func (l Limit) Regional(sharePPM int64) (rate, capacity float64) {
	s := float64(sharePPM) / region.PPM
	rate = l.Rate * s
	capacity = l.Burst * s
	if c := float64(l.Cost); capacity < c {
		capacity = c
	}
	return rate, capacity
}

// GrantRequest asks for Want tokens of Key.
type GrantRequest struct {
	Key   string
	Want  int64
	Limit Limit
	// MaxShare, when positive, caps the share the grant is made at: a key
	// whose share in force is above it has its share set to MaxShare first,
	// as a ShareUpdate without tokens would (the tokens above the new
	// capacity are dropped, not released), in the same store operation.
	// The share keeper uses it to write a share only where the store holds
	// a larger one (lease/service/deferred.go). Token buckets only; at most
	// region.PPM.
	MaxShare int64
	// Raise, when not nil, is a share update the grant carries, with the
	// shares the exchange set before it that the store has not applied: the
	// store applies each first, as SetShares would have when it was set
	// (never before the bucket's last update; the last step's tokens
	// credited once by generation; what a step releases dropped), so that
	// the bucket refills at each share over the time it was in force. The
	// share keeper carries the raises it keeps this way (lease/service,
	// carry.go) instead of writing them. Token buckets only; not with
	// MaxShare.
	Raise *ShareRaise
}

// ShareRaise is a share update carried by a grant (GrantRequest.Raise):
// Steps are the shares set, oldest first, each with how long before the
// store's now it was set (at most MaxRaiseAge, not increasing), the last
// the share to apply; Gen and Received are the last step's, as in
// ShareUpdate. At most MaxRaiseSteps steps.
type ShareRaise struct {
	Steps    []ShareStep
	Gen      uint64
	Received int64
}

// ShareStep is a share in ppm set Age ago.
type ShareStep struct {
	SharePPM int64
	Age      time.Duration
}

// MaxRaiseAge bounds ShareStep.Age: a day. MaxRaiseSteps bounds a raise's
// steps.
const (
	MaxRaiseAge   = 24 * time.Hour
	MaxRaiseSteps = 8
)

// Grant is the allocator's answer to one GrantRequest.
type Grant struct {
	// Granted tokens, already debited; 0 ≤ Granted ≤ Want.
	Granted int64
	// Tokens left in the regional bucket after the grant.
	Tokens float64
	// RetryAfter is, when Granted is 0, the time until the bucket holds
	// one whole token again; zero otherwise.
	RetryAfter time.Duration
	// Rate and Capacity are the regional bucket's parameters in force, at
	// SharePPM: the share the store applied (Limit.InitialShare while it
	// holds none).
	Rate     float64
	Capacity float64
	SharePPM int64
	// Err is non-nil when this item was rejected (wraps ErrInvalid); the
	// item debited nothing.
	Err error
}

// ReturnRequest gives Tokens of Key back to its bucket, capped at capacity.
type ReturnRequest struct {
	Key    string
	Tokens int64
	Limit  Limit
}

// ShareUpdate sets the applied share of Key in this region, and credits the
// tokens other regions gave it with share (docs/DESIGN.md, "Tokens move
// with share"). Lowering a share lowers the bucket's rate and capacity at
// once; the tokens above the new capacity leave the bucket and are reported
// in ShareResult.Released, for the exchange to give away with the share.
// The exchange lowers before it gives (DESIGN.md, "Level 2").
type ShareUpdate struct {
	Key      string
	SharePPM int64
	Limit    Limit
	// Received is the cumulative tokens, in region.TokenScale units, given
	// to this region for Key in the exchange generation Gen. The store
	// keeps what it credited per key for the newest Gen it saw and credits
	// only the rest, once: a duplicate, reordered or older update credits
	// nothing more, and an update of an older Gen credits nothing. Gen 0
	// carries no tokens. Both are in [0, 2^53].
	Gen      uint64
	Received int64
	// Window is, for a fixed window, the start (Unix µs) of the window
	// whose tokens Received counts: a window is a generation of its own,
	// and tokens of a window that has ended are never credited.
	Window int64
	// Steps are shares the exchange set before this one, oldest first,
	// that the store has not applied (raises the share keeper kept): the
	// store applies each as a write when it was set would have (never
	// before the bucket's last update; what a step releases dropped), then
	// the update itself. Token buckets only; as in ShareRaise.
	Steps []ShareStep
}

// ShareResult is the outcome of one ShareUpdate.
type ShareResult struct {
	// Released is the tokens, in region.TokenScale units, the update took
	// out of the bucket because they were above its new capacity (rounded
	// down; the fraction is lost).
	Released int64
	// Window is, for a fixed window, the start (Unix µs) of the window the
	// store's clock was in: the tokens released belong to it.
	Window int64
	// Tokens is the bucket's balance after the update.
	Tokens float64
}

// ShareUpdateFor is the store write that carries out the exchange's share
// change c for a key of limit l; the write's ShareResult.Released and
// Window go back into c.Released and c.ReleasedWindow.
func ShareUpdateFor(c region.ShareChange, l Limit) ShareUpdate {
	return ShareUpdate{Key: c.Key, SharePPM: c.SharePPM, Limit: l, Gen: c.Gen, Received: c.Received, Window: c.Window}
}
