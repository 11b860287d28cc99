package agent

import "sync/atomic"

// A key's leased tokens live in two slots, because a renewal arrives while
// the previous lease still has tokens and the two expire at different times:
// merging them would let the old tokens live until the new expiry, which the
// bound (DESIGN.md, "The bound") does not allow.
//
// Each slot is one atomic word, balance<<16 | generation, plus its expiry.
// The request path spends with a single atomic add of −n on the word (one
// cache-line transfer on a hot key, never a retry loop); a spend that takes
// the balance below zero failed and adds n back. The generation, in the low
// bits where an add of whole tokens never reaches it, changes whenever a
// slot is emptied for a new lease: undoing a failed spend and putting back a
// spend (when a later rule of the same request denies) only happen within
// the generation they came from, so a token can never move from an expired
// lease into a fresh one.
//
// The expiries sit on their own cache line, written only when a lease is
// installed, so reading them costs a hot key's cores nothing.
//
// Times are int64 nanoseconds of agent time (see core).

const (
	genBits = 16
	genMask = 1<<genBits - 1
	// maxLeaseTokens caps a slot's balance and maxSpend the tokens one
	// request may take on the lock-free path, so that the balance field
	// (47 bits and a sign) never overflows, however many spends are in
	// flight.
	maxLeaseTokens = 1 << 44
	maxSpend       = 1 << 40
)

type slots struct {
	// exp is when each slot's tokens stop being spendable; 0 once a spend
	// found the slot empty (a put-back racing with that is dropped at the
	// next collect: a few tokens of utilisation, never of the bound). A writer
	// stores it after emptying the word under a new generation and before
	// adding tokens, so a spend that read an old expiry either finds the
	// word empty or spends new tokens under an earlier (older) expiry.
	exp [2]atomic.Int64
	// word (on a cache line of its own in keyState, see there) is balance<<genBits | generation.
	word [2]atomic.Int64
	// lost counts tokens that left a lease without being spent, returned
	// or dropped by a writer: a put-back or an undo that found its lease
	// replaced. It also counts those undos' stake in the word and is exact
	// once they return (see emptyWord), so it may read low meanwhile.
	lost atomic.Int64
}

func balance(w int64) int64 { return w >> genBits }

func sameGen(a, b int64) bool { return (a^b)&genMask == 0 }

// spend takes n tokens from a live slot, the one expiring first when both
// are live. It returns the slot's index, its word after the spend and its
// expiry.
func (s *slots) spend(now, n int64) (int, int64, int64, bool) {
	if n > maxSpend {
		return 0, 0, 0, false
	}
	exp := [2]int64{s.exp[0].Load(), s.exp[1].Load()}
	first := 0
	if exp[1] < exp[0] {
		first = 1
	}
	for j := 0; j < 2; j++ {
		i := first ^ j
		if exp[i] <= now {
			continue
		}
		w := s.word[i].Add(-n << genBits)
		if balance(w) >= 0 {
			return i, w, exp[i], true
		}
		if !undoFailed(&s.word[i], &s.lost, w, n) {
			continue
		}
		if s.emptyIn(i, w) {
			// Retire the slot, so that later spends skip it without
			// touching its word instead of failing there until it expires.
			s.retire(i, w, exp[i])
		}
	}
	return 0, 0, 0, false
}

// emptyIn reports whether slot i holds no token in the generation of w, a
// spend's word after it failed there. A balance below zero is other spends
// failing right now, not emptiness.
func (s *slots) emptyIn(i int, w int64) bool {
	cur := s.word[i].Load()
	return sameGen(cur, w) && balance(cur) == 0
}

// retire marks slot i, found empty in the generation of w, as spent, by
// setting its expiry exp to 0. The CAS leaves a newer lease with another
// expiry alone; a writer that installed one with the very same expiry in
// between has emptied the word under a new generation first, so the
// generation tells, and the expiry goes back. The writer stores its expiry
// after emptying: if that store is still to come, it wins anyway.
func (s *slots) retire(i int, w, exp int64) {
	if s.exp[i].CompareAndSwap(exp, 0) && !sameGen(s.word[i].Load(), w) {
		s.exp[i].CompareAndSwap(0, exp)
	}
}

// spendAll takes n tokens from a live slot, like spend, but never drives a
// balance below zero, so a large take that fails does not make concurrent
// small spends fail with it. For refills of a stripe entry, off the
// per-request path.
func (s *slots) spendAll(now, n int64) (int, int64, int64, bool) {
	if n > maxSpend {
		return 0, 0, 0, false
	}
	exp := [2]int64{s.exp[0].Load(), s.exp[1].Load()}
	first := 0
	if exp[1] < exp[0] {
		first = 1
	}
	for j := 0; j < 2; j++ {
		i := first ^ j
		if exp[i] <= now {
			continue
		}
		for {
			w := s.word[i].Load()
			if balance(w) < n {
				break
			}
			if s.word[i].CompareAndSwap(w, w-n<<genBits) {
				return i, w - n<<genBits, exp[i], true
			}
		}
	}
	return 0, 0, 0, false
}

// putBack returns n tokens spent from slot i when its word became after.
// It reports false when the lease was replaced meanwhile: the tokens are
// then lost (counted as such), never moved into the new lease.
func (s *slots) putBack(i int, after, n int64) bool {
	if addSameGen(&s.word[i], after, n) {
		return true
	}
	s.lost.Add(n)
	return false
}

// live returns the tokens in slots that are still spendable at now.
func (s *slots) live(now int64) int64 {
	var n int64
	for i := range s.word {
		if s.exp[i].Load() > now {
			n += max(balance(s.word[i].Load()), 0)
		}
	}
	return n
}

// otherLive returns the live tokens of the slot other than i.
func (s *slots) otherLive(i int, now int64) int64 {
	if s.exp[i^1].Load() > now {
		return max(balance(s.word[i^1].Load()), 0)
	}
	return 0
}

// total returns every token held, spendable or not yet collected as expired.
func (s *slots) total() int64 {
	return max(balance(s.word[0].Load()), 0) + max(balance(s.word[1].Load()), 0)
}

// empty takes every token out of slot i under a new generation and returns
// them. A balance below zero (spends failing at this instant) holds none:
// those spends count what they held off (see emptyWord).
func (s *slots) empty(i int) int64 { return emptyWord(&s.word[i], &s.lost) }

// install adds a grant of n tokens spendable until exp. It fills a slot that
// is expired or empty; when both hold live tokens it replaces the earlier
// one if that holds fewer than n (dropping them), else adds to the later
// one, lowering its expiry to exp if exp is earlier, so that no token ever
// outlives its own lease. It returns the tokens it found
// in the slot it emptied (expired ones, or a racing put-back), which the
// caller counts as dropped. Writers are serialised by the key's mutex.
func (s *slots) install(now, exp, n int64) (dropped int64) {
	free := -1
	for i := range s.word {
		if s.exp[i].Load() <= now || balance(s.word[i].Load()) <= 0 {
			if free < 0 || s.exp[i].Load() < s.exp[free].Load() {
				free = i
			}
		}
	}
	if free >= 0 {
		dropped = s.empty(free)
		s.exp[free].Store(exp)
		s.word[free].Add(min(n, maxLeaseTokens) << genBits)
		return dropped + max(n-maxLeaseTokens, 0)
	}
	// Both hold live tokens. If the earlier lease has fewer left than the
	// grant brings, replace it (its few tokens were about to expire); else
	// add to the later one, at the earlier of the two expiries.
	later := 0
	if s.exp[1].Load() > s.exp[0].Load() {
		later = 1
	}
	if earlier := later ^ 1; balance(s.word[earlier].Load()) < n {
		dropped = s.empty(earlier)
		s.exp[earlier].Store(exp)
		s.word[earlier].Add(min(n, maxLeaseTokens) << genBits)
		return dropped + max(n-maxLeaseTokens, 0)
	}
	if exp < s.exp[later].Load() {
		s.exp[later].Store(exp)
	}
	room := max(maxLeaseTokens-balance(s.word[later].Load()), 0)
	s.word[later].Add(min(n, room) << genBits)
	return max(n-room, 0)
}

// takeUpTo removes up to n tokens from slot i, leaving its generation and
// expiry alone, and returns how many it took.
func (s *slots) takeUpTo(i int, n int64) int64 {
	for {
		w := s.word[i].Load()
		t := min(max(balance(w), 0), n)
		if t == 0 || s.word[i].CompareAndSwap(w, w-t<<genBits) {
			return t
		}
	}
}

// collect empties the slots that are expired at now and returns their
// tokens (dropped at expiry).
func (s *slots) collect(now int64) (dropped int64) {
	for i := range s.word {
		if s.exp[i].Load() <= now && balance(s.word[i].Load()) > 0 {
			dropped += s.empty(i)
		}
	}
	return dropped
}

// drain empties both slots: live tokens can be returned to the region,
// expired ones are dropped.
func (s *slots) drain(now int64) (live, dropped int64) {
	for i := range s.word {
		expired := s.exp[i].Load() <= now
		n := s.empty(i)
		if expired {
			dropped += n
		} else {
			live += n
		}
	}
	return live, dropped
}

// firstExpiry is the earliest expiry among slots holding live tokens at
// now, or now when none does.
func (s *slots) firstExpiry(now int64) int64 {
	first := int64(-1)
	for i := range s.word {
		if e := s.exp[i].Load(); e > now && balance(s.word[i].Load()) > 0 && (first < 0 || e < first) {
			first = e
		}
	}
	if first < 0 {
		return now
	}
	return first
}
