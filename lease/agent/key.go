package agent

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ration-dev/ration/policy"
)

const cacheLine = 64

// keyState is one rate-limited key as this agent holds it: leased tokens,
// the deny cache, demand counters and what the region said last.
//
// The request path reads the first cache line and spends from slots with
// atomics only; everything under mu belongs to the slow path and the
// refresher. The slots' words, which every spend of a hot key writes, start
// the second line, so that their CAS traffic does not evict the read-mostly
// first line from other cores' caches; the rest of that line holds the id,
// which a lookup compares (so that finding a key reads no line that
// deciding on it does not), and fields written only under mu, on grants
// and reports. The layout is laid out by offset rather than padded (a
// million keys held are what the padding would cost): the struct is four
// cache lines, and Go allocates objects of that size class at multiples of
// their size from a page, so on cache-line boundaries (TestKeyStateLayout
// checks both). What few keys need (requests joining a round trip, failure
// modes) is in keyRare, allocated when first needed.
type keyState struct {
	// Line 0: read on every decision, written when a grant is applied.
	denyUntil atomic.Int64                // agent nanos: without tokens, deny locally until then
	lowWater  atomic.Int64                // tokens: a spend leaving fewer queues a refresh
	remaining atomic.Int64                // the regional bucket's whole tokens at the last grant
	cache     atomic.Pointer[stripeCache] // set once the key's leases are large
	queued    atomic.Bool                 // a background refresh is queued or in flight
	evicted   atomic.Bool
	hasGrant  bool  // under mu: the region answered at least once
	ruleLen   uint8 // id[:ruleLen] is the rule's name (at most 64 bytes)
	// heapIdx is the position in the refresher's schedule (-1 when not
	// scheduled), under core.smu: written by schedule changes, about as
	// rarely as grants.
	heapIdx int32

	// The leases: expiries end line 0, the words start line 1.
	slots slots

	// The rest of line 1: the id, set once, and fields under mu.
	id string // rule name, NUL, key: the map key
	// Cumulative token accounting: net is the tokens granted and neither
	// dropped nor returned, so spent = net − held. (Only that difference
	// is read per key; the agent's counters keep the three apart.)
	net int64
	// Demand already reported to the region.
	reportedAsked, reportedAdmitted int64

	mu sync.Mutex
	// flight is the round trip in progress for this key, sync or
	// background; at most one at a time.
	flight *flight
	// rare is set, under mu, the first time the key needs it.
	rare atomic.Pointer[keyRare]
	// Tokens denied, counted where it happens (never on the leased path).
	denied   atomic.Int64
	rate     spendRate
	lastWant int64 // the previous lease's size, which caps the next
	// What the last grant said.
	regionRate, capacity float64
	ttl                  time.Duration // the lease TTL
	// Activity, for returning an unused lease and evicting an idle key.
	checkedAsked int64
	checkedAt    int64
	recentRate   float64 // tokens/s asked between the last two checks
	lastActive   int64
	// due is when the refresher's schedule next checks the key.
	due int64
}

// keyRare is the state of a key that few keys need, allocated the first
// time a key needs it and kept while the key is held: a key that nobody
// asks for while its round trip is in flight, and that the region never
// fails, does without it.
type keyRare struct {
	// Demand outside the leases: tokens admitted by failure modes,
	// counted where it happens.
	extra atomic.Int64

	// The rest under keyState.mu. Tokens of requests that joined the round
	// trip in flight, and those of the last one's waiting requests that its
	// grant did not cover (when it completed: unservedAt), which the next
	// lease asks for.
	joined, unserved int64
	unservedAt       int64
	fallback         emergency
}

// rareLocked returns k's rare state, allocating it if need be (k.mu held).
func (k *keyState) rareLocked() *keyRare {
	r := k.rare.Load()
	if r == nil {
		r = &keyRare{}
		k.rare.Store(r)
	}
	return r
}

// rareState is rareLocked without k.mu, which it takes only to allocate:
// a hot key's failure-open decisions do not contend on it.
func (k *keyState) rareState() *keyRare {
	if r := k.rare.Load(); r != nil {
		return r
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rareLocked()
}

// fallback returns k's emergency bucket, nil for a key without rare state,
// whose bucket was never used (k.mu held).
func (k *keyState) fallback() *emergency {
	if r := k.rare.Load(); r != nil {
		return &r.fallback
	}
	return nil
}

// joinedLocked returns the tokens of requests that joined k's round trip in
// flight, and forgets them (k.mu held).
func (k *keyState) joinedLocked() int64 {
	r := k.rare.Load()
	if r == nil {
		return 0
	}
	n := r.joined
	r.joined = 0
	return n
}

// setUnservedLocked records that a grant at now left n tokens of waiting
// requests unserved (k.mu held).
func (k *keyState) setUnservedLocked(n, now int64) {
	r := k.rare.Load()
	if r == nil && n == 0 {
		return // as recorded: nothing unserved
	}
	r = k.rareLocked()
	r.unserved, r.unservedAt = n, now
}

// extra is the tokens failure modes admitted on k.
func (k *keyState) extra() int64 {
	if r := k.rare.Load(); r != nil {
		return r.extra.Load()
	}
	return 0
}

// newKeyState returns the state of id, whose first ruleLen bytes are its
// rule's name (policy allows at most 64).
func newKeyState(id string, ruleLen int, now int64) *keyState {
	return &keyState{id: id, ruleLen: uint8(ruleLen), rate: newSpendRate(), lastActive: now, heapIdx: -1}
}

// rule returns the name of k's rule.
func (k *keyState) rule() string { return k.id[:k.ruleLen] }

// key returns k's key within its rule.
func (k *keyState) key() string { return k.id[k.ruleLen+1:] }

func (k *keyState) isEvicted() bool { return k.evicted.Load() }

// spent is the tokens requests took from this key's leases so far.
func (k *keyState) spentLocked() int64 {
	return k.net - k.held() - k.slots.lost.Load()
}

// askedLocked is the key's cumulative demand in tokens: spent from leases,
// admitted by a failure mode, or denied.
func (k *keyState) askedLocked() int64 {
	return k.spentLocked() + k.extra() + k.denied.Load()
}

// flight is one round trip that several requests may wait for.
type flight struct {
	done chan struct{}
	err  error // set before done is closed

	// The keys asked for, their rules and the tokens the asking request
	// needs (a background refresh needs one cost).
	keys  []*keyState
	rules []*policy.Rule
	needs []int64
	// sync: requests wait for this round trip, and their needs are demand
	// the call reports (a background refresh's one cost is not).
	sync bool
}

// flightDone reports whether f's round trip has completed.
func flightDone(f *flight) bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}
