package agent

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

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
// million keys held are what the padding would cost): the struct is three
// cache lines, and Go allocates objects of that size class at multiples of
// their size from a page, so on cache-line boundaries (TestKeyStateLayout
// checks both). What few keys need (a stripe cache, requests joining a
// round trip, failure modes) is in keyRare, allocated when first needed.
//
// Three lines leave no room to spare, so fields are as narrow as their
// values allow: estimates (rates, the region's rate and capacity, the
// lease TTL, the last lease's size, the regional remainder shown in
// headers) are float32, whose 24-bit mantissa is far finer than their
// noise; the low-water mark is an int32 (clamped: a key whose low water
// passes two billion tokens refreshes when its balance falls below that);
// and the id is a pointer to its length-prefixed bytes (see id).
type keyState struct {
	// Line 0: read on every decision, written when a grant is applied.
	denyUntil atomic.Int64            // agent nanos: without tokens, deny locally until then
	rare      atomic.Pointer[keyRare] // set, under mu, the first time the key needs it
	lowWater  atomic.Int32            // tokens: a spend leaving fewer queues a refresh
	remaining atomic.Uint32           // float32 bits: the regional bucket's tokens at the last grant
	// flags holds flagQueued, flagEvicted and flagGranted, and above them
	// (set once) the rule name's length: id[:ruleLen] is the rule's name
	// (at most 64 bytes). One word, since an atomic.Bool takes four bytes.
	flags keyFlags
	// heapIdx is the position in the refresher's schedule (-1 when not
	// scheduled) and due when the schedule next checks the key, under
	// core.smu: written by schedule changes, about as rarely as grants.
	heapIdx int32
	due     int64
	// What the last grant said (under mu): the region's rate and capacity.
	regionRate, capacity float32

	// The leases: expiries end line 0, the words start line 1.
	slots slots

	// The rest of line 1: the id, set once, and fields under mu.
	idp *byte // uvarint length, then rule name, NUL, key: the map key
	// Cumulative token accounting: net is the tokens granted and neither
	// dropped nor returned, so spent = net − held. (Only that difference
	// is read per key; the agent's counters keep the three apart.)
	net int64
	// Demand already reported to the region.
	reportedAsked, reportedAdmitted int64
	ttl                             float32 // seconds: the last grant's lease TTL
	lastWant                        float32 // the previous lease's size, which caps the next

	// Line 2: the slow path's and the refresher's, under mu.
	mu sync.Mutex
	// flight is the round trip in progress for this key, sync or
	// background; at most one at a time.
	flight *flight
	rate   spendRate
	// Activity, for returning an unused lease and evicting an idle key.
	checkedAsked int64
	checkedAt    int64
	lastActive   int64
}

// keyRare is the state of a key that few keys need, allocated the first
// time a key needs it and kept while the key is held: a key that nobody
// asks for while its round trip is in flight, that is never denied nor
// decided by a failure mode, and whose leases stay small, does without it.
type keyRare struct {
	// cache is set once the key's leases are large (read by decisions).
	cache atomic.Pointer[stripeCache]
	// Demand outside the leases, counted where it happens: tokens admitted
	// by failure modes, and tokens denied (never on the leased path; a key
	// with a deny cache entry has its rare state before the entry, so that
	// the deny cache's decisions allocate nothing).
	extra, denied atomic.Int64

	// The rest under keyState.mu. Tokens of requests that joined the round
	// trip in flight, and those of the last one's waiting requests that its
	// grant did not cover (when it completed: unservedAt), which the next
	// lease asks for.
	joined, unserved int64
	unservedAt       int64
	fallback         emergency
}

// setGrantLocked records what a grant said of k's regional bucket: its
// rate and capacity, and the lease TTL (k.mu held).
func (k *keyState) setGrantLocked(rate, capacity float64, ttl time.Duration) {
	k.flags.set(flagGranted, true)
	k.regionRate, k.capacity, k.ttl = float32(rate), float32(capacity), float32(ttl.Seconds())
}

// cache returns k's stripe cache, nil for a key whose leases never were
// large.
func (k *keyState) cache() *stripeCache {
	if r := k.rare.Load(); r != nil {
		return r.cache.Load()
	}
	return nil
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

// addDenied counts n tokens denied on k. Only a key's first denial
// outside its deny cache (a failure mode's, or a request beyond the
// bucket) allocates.
func (k *keyState) addDenied(n int64) { k.rareState().denied.Add(n) }

// denied is the tokens denied on k.
func (k *keyState) denied() int64 {
	if r := k.rare.Load(); r != nil {
		return r.denied.Load()
	}
	return 0
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
func newKeyState[ID string | []byte](id ID, ruleLen int, now int64) *keyState {
	k := &keyState{idp: packID(id), rate: newSpendRate(), lastActive: now, heapIdx: -1}
	k.flags.Store(uint32(ruleLen) << ruleLenShift)
	return k
}

// keyFlags is a key's flags word (see keyState.flags).
type keyFlags struct{ atomic.Uint32 }

const (
	flagQueued   = 1 << iota // a background refresh is queued or in flight
	flagEvicted              // forgotten: a new state takes its id
	flagGranted              // under mu: the region answered at least once
	ruleLenShift = 8
)

func (f *keyFlags) has(flag uint32) bool { return f.Load()&flag != 0 }

// set sets flag, or clears it.
func (f *keyFlags) set(flag uint32, on bool) {
	if on {
		f.Or(flag)
	} else {
		f.And(^flag)
	}
}

// setFirst sets flag and reports whether it was clear.
func (f *keyFlags) setFirst(flag uint32) bool { return f.Or(flag)&flag == 0 }

func (k *keyState) ruleLen() int { return int(k.flags.Load() >> ruleLenShift) }

// packID returns id behind its length, a uvarint, in one allocation: a
// pointer to it costs a key 8 bytes where a string header costs 16.
func packID[ID string | []byte](id ID) *byte {
	var n [binary.MaxVarintLen64]byte
	w := binary.PutUvarint(n[:], uint64(len(id)))
	b := make([]byte, w+len(id))
	copy(b, n[:w])
	copy(b[w:], id)
	return &b[0]
}

// id returns k's id: rule name, NUL, key.
func (k *keyState) id() string {
	p := unsafe.Pointer(k.idp)
	n, shift := uint64(0), uint(0)
	for {
		c := *(*byte)(p)
		p = unsafe.Add(p, 1)
		n |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return unsafe.String((*byte)(p), int(n))
		}
		shift += 7
	}
}

// rule returns the name of k's rule.
func (k *keyState) rule() string { return k.id()[:k.ruleLen()] }

// key returns k's key within its rule.
func (k *keyState) key() string { return k.id()[k.ruleLen()+1:] }

func (k *keyState) isEvicted() bool { return k.flags.has(flagEvicted) }

// spent is the tokens requests took from this key's leases so far.
func (k *keyState) spentLocked() int64 {
	return k.net - k.held() - k.slots.lost.Load()
}

// askedLocked is the key's cumulative demand in tokens: spent from leases,
// admitted by a failure mode, or denied.
func (k *keyState) askedLocked() int64 {
	return k.spentLocked() + k.extra() + k.denied()
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
