package service

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/ration-dev/ration/lease"
)

// A dry key is one whose regional bucket holds no whole token: the store
// grants nothing until it refills. Every agent that sees such a key asks
// again once its deny cache runs out, a herd of store operations for each
// token the bucket refills. The service remembers, per store key, until when
// the bucket cannot grant (from the store's answer: the retry hint of a
// denial, or the refill time of the fraction a grant left) and answers
// asks before then itself. The memory only ever denies: a bucket that
// refills sooner than remembered (a share raised, tokens given with share
// or returned) costs the wait, never an admission, and those events forget
// the key where this service sees them (Forget, Return). It is bounded in
// time (Config.DryFor, and the sync period for global keys) and in keys
// (Config.DryKeys: the oldest half is dropped when full).

// dryShards spreads the memory over locks: every Lease call looks its keys up.
const dryShards = 64

// dryKey is what the service remembers of a dry bucket: until when it
// cannot grant at the rate it had (Clock nanoseconds), which a denial's
// retry hint tells, until when the memory is trusted (at most the limit
// after the ask), and its rate and capacity, which a denial reports.
type dryKey struct {
	until, trust   int64
	rate, capacity float64
}

type dryShard struct {
	mu       sync.Mutex
	cur, old map[string]dryKey
}

// dryMemory is the service's memory of dry keys. The zero value is not
// usable; see newDryMemory. A nil *dryMemory remembers nothing.
type dryMemory struct {
	seed   maphash.Seed
	half   int // entries a shard's cur holds before it becomes old
	shards [dryShards]dryShard
}

func newDryMemory(keys int) *dryMemory {
	if keys <= 0 {
		return nil
	}
	m := &dryMemory{seed: maphash.MakeSeed(), half: max(keys/dryShards/2, 1)}
	for i := range m.shards {
		m.shards[i].cur = make(map[string]dryKey)
	}
	return m
}

func (m *dryMemory) shard(key string) *dryShard {
	return &m.shards[maphash.String(m.seed, key)%dryShards]
}

// lookup returns what is remembered of key if it is still trusted dry at now.
func (m *dryMemory) lookup(key string, now int64) (dryKey, bool) {
	if m == nil {
		return dryKey{}, false
	}
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	d, ok := sh.cur[key]
	if !ok {
		d, ok = sh.old[key]
	}
	if !ok {
		return dryKey{}, false
	}
	if d.trust <= now {
		delete(sh.cur, key)
		delete(sh.old, key)
		return dryKey{}, false
	}
	return d, true
}

// note records the store's answer g to an ask of key under l, sent at
// sent: dry until the bucket holds one cost again, trusted for at most
// limit. Any other answer forgets the key.
func (m *dryMemory) note(key string, g *lease.Grant, l lease.Limit, sent int64, limit time.Duration) {
	if m == nil {
		return
	}
	var wait time.Duration
	switch {
	case g.Err != nil:
	case g.Granted == 0:
		wait = g.RetryAfter
	case !l.Fixed() && g.Tokens < float64(l.Cost) && g.Rate > 0:
		// The store acted after sent, so its bucket refills no sooner
		// than this. (A fixed window refills only at its end, which a
		// denial's hint tells.)
		wait = time.Duration(min((float64(l.Cost)-max(g.Tokens, 0))/g.Rate*1e9, float64(lease.MaxRetryAfter)))
	}
	// The store's hints are rounded up to its microsecond clock: a
	// microsecond less never denies what the store would grant.
	wait -= time.Microsecond
	if wait <= 0 || limit <= 0 {
		m.forget(key)
		return
	}
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.cur[key]; !ok && len(sh.cur) >= m.half {
		sh.old, sh.cur = sh.cur, make(map[string]dryKey, m.half)
	}
	delete(sh.old, key)
	sh.cur[key] = dryKey{until: sent + int64(wait), trust: sent + int64(min(wait, limit)), rate: g.Rate, capacity: g.Capacity}
}

// forget drops what is remembered of key.
func (m *dryMemory) forget(key string) {
	if m == nil {
		return
	}
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	delete(sh.cur, key)
	delete(sh.old, key)
}

// clear forgets every key (a new policy may change every limit).
func (m *dryMemory) clear() {
	if m == nil {
		return
	}
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.cur, sh.old = make(map[string]dryKey), nil
		sh.mu.Unlock()
	}
}

// len is the number of keys remembered, expired or not (for tests).
func (m *dryMemory) len() int {
	if m == nil {
		return 0
	}
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.cur) + len(sh.old)
		sh.mu.Unlock()
	}
	return n
}
