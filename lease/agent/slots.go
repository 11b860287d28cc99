package agent

import "sync/atomic"

// A key's leased tokens live in two slots, because a renewal arrives while
// the previous lease still has tokens and the two expire at different times:
// merging them would let the old tokens live until the new expiry, which the
// bound (DESIGN.md, "The bound") does not allow.
//
// Each slot is one atomic word, generation<<48 | balance, plus its expiry.
// Spending is a CAS on the word, so the request path takes no lock. The
// generation changes whenever the slot is emptied for a new lease; a spend
// that must be put back (a later rule of the same request failed) is put
// back only into the generation it came from, so a token can never move
// from an expired lease into a fresh one.
//
// Times are int64 nanoseconds since the agent's start (see Agent.now).

const (
	balBits = 48
	balMask = 1<<balBits - 1
	// maxLeaseTokens caps one slot's balance, leaving room so that adding a
	// grant can never carry into the generation bits.
	maxLeaseTokens = balMask >> 1
)

type slot struct {
	word atomic.Uint64 // generation<<balBits | balance
	// exp is when the slot's tokens stop being spendable. Writers store it
	// after emptying the word under a new generation and before adding
	// tokens, so a reader that loads the word first and exp second never
	// pairs tokens with a later expiry than their own.
	exp atomic.Int64
}

type slots [2]slot

func balance(w uint64) int64 { return int64(w & balMask) }

func nextGen(w uint64) uint64 { return (w>>balBits + 1) << balBits & ^uint64(balMask) }

// spend takes n tokens from a live slot, the one expiring first when both
// have enough. It returns the slot's index and its word after the spend.
func (s *slots) spend(now, n int64) (int, uint64, bool) {
	first := 0
	if s[1].exp.Load() < s[0].exp.Load() {
		first = 1
	}
	for j := 0; j < 2; j++ {
		i := first ^ j
		sl := &s[i]
		for {
			w := sl.word.Load()
			if balance(w) < n || sl.exp.Load() <= now {
				break
			}
			if sl.word.CompareAndSwap(w, w-uint64(n)) {
				return i, w - uint64(n), true
			}
		}
	}
	return 0, 0, false
}

// putBack returns n tokens spent from slot i when its word became after, if
// the slot still holds the same lease. It reports false when the lease was
// replaced meanwhile: the tokens are then lost (counted as dropped), never
// moved into the new lease.
func (s *slots) putBack(i int, after uint64, n int64) bool {
	sl := &s[i]
	gen := after >> balBits
	for {
		w := sl.word.Load()
		if w>>balBits != gen {
			return false
		}
		if sl.word.CompareAndSwap(w, w+uint64(n)) {
			return true
		}
	}
}

// live returns the tokens in slots that are still spendable at now.
func (s *slots) live(now int64) int64 {
	var n int64
	for i := range s {
		if w := s[i].word.Load(); s[i].exp.Load() > now {
			n += balance(w)
		}
	}
	return n
}

// otherLive returns the live tokens of the slot other than i.
func (s *slots) otherLive(i int, now int64) int64 {
	o := &s[i^1]
	if w := o.word.Load(); o.exp.Load() > now {
		return balance(w)
	}
	return 0
}

// total returns every token held, spendable or not yet collected as expired.
func (s *slots) total() int64 {
	return balance(s[0].word.Load()) + balance(s[1].word.Load())
}

// empty takes every token out of slot i under a new generation and returns
// them.
func (s *slots) empty(i int) int64 {
	sl := &s[i]
	for {
		w := sl.word.Load()
		if sl.word.CompareAndSwap(w, nextGen(w)) {
			return balance(w)
		}
	}
}

// install adds a grant of n tokens spendable until exp. It fills a slot that
// is expired or empty; when both hold live tokens it adds to the one that
// expires later and lowers that slot's expiry to exp if exp is earlier, so
// that no token ever outlives its own lease. It returns the tokens it found
// in the slot it emptied (expired ones, or a racing put-back), which the
// caller counts as dropped. Writers are serialised by the key's mutex.
func (s *slots) install(now, exp, n int64) (dropped int64) {
	free := -1
	for i := range s {
		if s[i].exp.Load() <= now || balance(s[i].word.Load()) == 0 {
			if free < 0 || s[i].exp.Load() < s[free].exp.Load() {
				free = i
			}
		}
	}
	if free >= 0 {
		dropped = s.empty(free)
		s[free].exp.Store(exp)
		s[free].word.Add(uint64(min(n, maxLeaseTokens)))
		return dropped
	}
	later := 0
	if s[1].exp.Load() > s[0].exp.Load() {
		later = 1
	}
	if exp < s[later].exp.Load() {
		s[later].exp.Store(exp)
	}
	room := maxLeaseTokens - balance(s[later].word.Load())
	s[later].word.Add(uint64(max(min(n, room), 0)))
	if n > room {
		dropped = n - room
	}
	return dropped
}

// collect empties the slots that are expired at now and returns their
// tokens (dropped at expiry).
func (s *slots) collect(now int64) (dropped int64) {
	for i := range s {
		if s[i].exp.Load() <= now && balance(s[i].word.Load()) > 0 {
			dropped += s.empty(i)
		}
	}
	return dropped
}

// drain empties both slots: live tokens can be returned to the region,
// expired ones are dropped.
func (s *slots) drain(now int64) (live, dropped int64) {
	for i := range s {
		expired := s[i].exp.Load() <= now
		n := s.empty(i)
		if expired {
			dropped += n
		} else {
			live += n
		}
	}
	return live, dropped
}
