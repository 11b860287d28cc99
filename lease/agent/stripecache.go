package agent

import "sync/atomic"

// A hot key spent from every core contends on its slots' cache line: each
// spend moves the line between cores, and that transfer, not the arithmetic,
// bounds the key's throughput. A key whose leases are large therefore gets
// a stripe cache: one entry per decision stripe (each pooled scratch, so in
// practice each P, uses one stripe), each on its own cache line. A spend
// takes from its stripe's entry, an uncontended atomic add; when the entry
// runs dry it takes its own request's tokens and a batch for the entry from
// the slots in the same atomic add.
//
// The tokens in an entry are still the key's leased tokens: an entry keeps
// the expiry of the slot they came from and is counted, drained, collected
// and returned with the slots. Tokens of one stripe are not lent to
// another, so a stripe may ask the region while another stripe holds a
// batch: the batch is kept small (a sixteenth of a lease per stripe or less)
// and a key gets a cache only when its leases are large, where that is noise.

// cacheMinLease is the lease size from which a key gets a stripe cache.
const cacheMinLease = 4096

// cacheSlot + j marks, in ruleResult.slot, tokens taken from stripe entry j.
const cacheSlot = 2

type cacheEntry struct {
	word atomic.Int64 // balance<<genBits | generation, as in slots
	exp  atomic.Int64
	_    [cacheLine - 16]byte
}

type stripeCache struct {
	e     []cacheEntry
	batch atomic.Int64 // tokens an entry takes at once
}

// take spends n tokens of k for a decision on stripe idx: from the stripe's
// cache entry when k has a cache, else (or when the entry and a refill
// fail) from the slots. It returns where the tokens came from (a slot index
// or cacheSlot + entry) and the word after the spend, for a put-back.
func (c *core) take(k *keyState, idx int, now, n int64) (int, int64, bool) {
	sc := k.cache()
	if sc == nil {
		i, w, _, ok := k.slots.spend(now, n)
		return i, w, ok
	}
	own := idx
	if own >= len(sc.e) { // stripes index the entries; a division only if not
		own %= len(sc.e)
	}
	e := &sc.e[own]
	if w, ok := k.spendEntry(e, now, n); ok {
		return cacheSlot + own, w, true
	}
	// A batch of whole requests of this size, so that a steady stream of
	// equal requests empties the entry exactly instead of stranding a
	// remainder too small for the next one.
	b := max(sc.batch.Load()/n, 1) * n
	if i, w, exp, ok := k.slots.spendAll(now, n+b); ok {
		// The request's n came from slot i; the batch goes to the entry,
		// with that slot's expiry.
		c.refill(k, e, exp, b)
		return i, w, true
	}
	if i, w, _, ok := k.slots.spend(now, n); ok {
		return i, w, true
	}
	// The slots are dry: borrow from the other stripes' entries rather
	// than leave their tokens stranded while this request goes to the
	// region.
	for j := range sc.e {
		if j != own {
			if w, ok := k.spendEntry(&sc.e[j], now, n); ok {
				return cacheSlot + j, w, true
			}
		}
	}
	return 0, 0, false
}

// spendEntry takes n tokens from entry e if it holds them, live, at now.
func (k *keyState) spendEntry(e *cacheEntry, now, n int64) (int64, bool) {
	if e.exp.Load() <= now {
		return 0, false
	}
	w := e.word.Add(-n << genBits)
	if balance(w) >= 0 {
		return w, true
	}
	undoFailed(&e.word, &k.slots.lost, w, n)
	return 0, false
}

// refill replaces entry e's tokens with b tokens expiring at exp. Tokens it
// finds there (expired ones, or a racing put-back) are dropped.
func (c *core) refill(k *keyState, e *cacheEntry, exp, b int64) {
	if left := emptyWord(&e.word, &k.slots.lost); left > 0 {
		k.slots.lost.Add(left)
		c.ctr.dropped.Add(left)
	}
	e.exp.Store(exp)
	e.word.Add(b << genBits)
}

// putBackCache returns n tokens to k's entry j, as putBack does for a
// slot.
func (k *keyState) putBackCache(j int, after, n int64) bool {
	c := k.cache()
	if c != nil && addSameGen(&c.e[j].word, after, n) {
		return true
	}
	k.slots.lost.Add(n)
	return false
}

// undoFailed gives back the n tokens of a spend that took word to w, below
// zero, and reports whether it could. When a writer emptied the word
// meanwhile, the spend's −n was part of the balance the writer saw, so the
// writer counted neither the tokens the spend held off nor the debt: the
// writer counts its balance's negative part as lost (see emptyWord) and the
// spend counts all its n, so that together they count exactly the tokens
// the word held. Counting here only the part of n that w shows as real
// (balance(w)+n) loses tokens whenever other failed spends were undone, or
// tokens put back, between this spend's add and the writer's emptying.
func undoFailed(word, lost *atomic.Int64, w, n int64) bool {
	if addSameGen(word, w, n) {
		return true
	}
	lost.Add(n)
	return false
}

// addSameGen adds n tokens to word if it still holds the generation of w.
func addSameGen(word *atomic.Int64, w, n int64) bool {
	for {
		cur := word.Load()
		if !sameGen(cur, w) {
			return false
		}
		if word.CompareAndSwap(cur, cur+n<<genBits) {
			return true
		}
	}
}

// The key-level views of its tokens: slots and stripe entries together.

// held returns every token k holds, spendable or not yet collected.
func (k *keyState) held() int64 {
	n := k.slots.total()
	if c := k.cache(); c != nil {
		for i := range c.e {
			n += max(balance(c.e[i].word.Load()), 0)
		}
	}
	return n
}

// liveTokens returns k's tokens spendable at now.
func (k *keyState) liveTokens(now int64) int64 {
	n := k.slots.live(now)
	if c := k.cache(); c != nil {
		for i := range c.e {
			if c.e[i].exp.Load() > now {
				n += max(balance(c.e[i].word.Load()), 0)
			}
		}
	}
	return n
}

// collect empties what expired at now and returns it (dropped at expiry).
func (k *keyState) collect(now int64) int64 {
	n := k.slots.collect(now)
	if c := k.cache(); c != nil {
		for i := range c.e {
			if c.e[i].exp.Load() <= now && balance(c.e[i].word.Load()) > 0 {
				n += emptyWord(&c.e[i].word, &k.slots.lost)
			}
		}
	}
	return n
}

// drain empties everything: live tokens to return, expired ones dropped.
func (k *keyState) drain(now int64) (live, dropped int64) {
	live, dropped = k.slots.drain(now)
	if c := k.cache(); c != nil {
		for i := range c.e {
			expired := c.e[i].exp.Load() <= now
			if n := emptyWord(&c.e[i].word, &k.slots.lost); expired {
				dropped += n
			} else {
				live += n
			}
		}
	}
	return live, dropped
}

// firstExpiry is the earliest expiry among k's live tokens at now, or now.
func (k *keyState) firstExpiry(now int64) int64 {
	first := k.slots.firstExpiry(now)
	if c := k.cache(); c != nil {
		for i := range c.e {
			if e := c.e[i].exp.Load(); e > now && balance(c.e[i].word.Load()) > 0 && (first == now || e < first) {
				first = e
			}
		}
	}
	return first
}

// consolidateLocked gathers k's live tokens, spread over two slots and the
// stripe entries, into one slot, so that a request bigger than any single
// part can be served. The merged tokens take the earliest expiry among
// them: no token outlives its lease. It returns the expired tokens it
// dropped. Called with k.mu held.
func (k *keyState) consolidateLocked(now int64) (dropped int64) {
	exp := int64(-1)
	consider := func(e, w int64) {
		if e > now && balance(w) > 0 && (exp < 0 || e < exp) {
			exp = e
		}
	}
	for i := range k.slots.word {
		consider(k.slots.exp[i].Load(), k.slots.word[i].Load())
	}
	if c := k.cache(); c != nil {
		for i := range c.e {
			consider(c.e[i].exp.Load(), c.e[i].word.Load())
		}
	}
	live, dropped := k.drain(now)
	if live > 0 && exp > now {
		dropped += k.slots.install(now, exp, live)
	}
	return dropped
}

// emptyWord empties a balance word under a new generation and returns
// what it held. A balance below zero is failed spends not yet undone: each
// of them will find the generation changed and count its whole n as lost
// (undoFailed), more than the word held by the amount below zero, which
// emptyWord therefore takes off lost. lost is exact once those spends
// return, and may read low by the debt until they do.
func emptyWord(word, lost *atomic.Int64) int64 {
	for {
		w := word.Load()
		if word.CompareAndSwap(w, (w+1)&genMask) {
			if debt := min(balance(w), 0); debt < 0 {
				lost.Add(debt)
			}
			return max(balance(w), 0)
		}
	}
}
