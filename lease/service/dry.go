package service

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/ration-dev/ration/lease"
)

// A dry key is one whose regional bucket holds less than a request's cost:
// the store grants nothing until it refills. Every agent that sees such a
// key asks again once its deny cache runs out, a herd of store operations
// for each cost the bucket refills. The service remembers, per store key,
// until when the bucket cannot grant (from the store's answer: the retry
// hint of a denial, or the refill time of what a grant left) and answers
// asks before then itself. The memory only ever denies: a bucket that
// refills sooner than remembered (a share raised, tokens given with share
// or returned) costs the wait, never an admission, and those events forget
// the key where this service sees them (Forget, Return). It is bounded in
// time (Config.DryFor, and the sync period for global keys) and in keys
// (Config.DryKeys: the oldest half is dropped when full). Once it is no
// longer trusted one ask probes the store while the others wait a refill's
// time, and concurrent asks for a key that one call is asking the store for
// wait for that answer (claim): a herd costs one store operation.

// dryShards spreads the memory over locks: every Lease call looks its keys up.
const dryShards = 64

// dryKey is what the service remembers of a dry bucket: until when it
// cannot grant at the rate it had (Clock nanoseconds), which a denial's
// retry hint tells, until when the memory is trusted (at most the limit
// after the answer), the time a cost takes to refill (step), its rate and
// capacity, which a denial reports, and whether an ask let through once
// trust passed is still on its way to the store (probing).
type dryKey struct {
	until, trust, step int64
	rate, capacity     float64
	probing            bool
}

type dryShard struct {
	mu       sync.Mutex
	cur, old map[string]dryKey
	// flight holds the keys a Lease call is asking the store for, with the
	// call's channel, closed once its answers are noted: a concurrent ask
	// for one of them waits for it rather than asking too (claim).
	flight map[string]chan struct{}
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
		m.shards[i].flight = make(map[string]chan struct{})
	}
	return m
}

func (m *dryMemory) shard(key string) *dryShard {
	return &m.shards[maphash.String(m.seed, key)%dryShards]
}

// claim decides an ask of key at now: dry, with what is remembered; or
// another call is asking the store for key, and wait is closed once its
// answer is noted; or the ask goes to the store (a probe when it is the one
// let through as trust passed), and, with ch not nil, key is in flight with
// ch until land. A nil memory sends every ask.
//
// Dry means trusted dry, or, within a step after trust, while the one ask
// let through then (the probe) is on its way to the store: a bucket that
// held less than a cost when trust passed holds less than two a step later,
// and the probe asks for at least one, so the store would deny the others
// too.
func (m *dryMemory) claim(key string, now int64, ch chan struct{}) (d dryKey, dry bool, wait chan struct{}, probe bool) {
	if m == nil {
		return dryKey{}, false, nil, false
	}
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	d, dry, probe = sh.dryLocked(key, now)
	if dry {
		return d, true, nil, false
	}
	if ch == nil {
		return dryKey{}, false, nil, probe
	}
	switch f := sh.flight[key]; {
	case f == ch: // the same key twice in one call: both go with it
		return dryKey{}, false, nil, probe
	case f != nil:
		return dryKey{}, false, f, false
	}
	sh.flight[key] = ch
	return dryKey{}, false, nil, probe
}

// dryLocked is claim's memory: whether key is dry at now, and whether this
// ask is the probe let through once trust passed (sh.mu held).
func (sh *dryShard) dryLocked(key string, now int64) (dryKey, bool, bool) {
	d, ok := sh.cur[key]
	if !ok {
		d, ok = sh.old[key]
	}
	switch {
	case !ok:
		return dryKey{}, false, false
	case now < d.trust:
		return d, true, false
	case now >= d.trust+d.step:
		delete(sh.cur, key)
		delete(sh.old, key)
		return dryKey{}, false, false
	case d.probing:
		d.until = d.trust + d.step
		return d, true, false
	}
	d.probing = true
	if _, inCur := sh.cur[key]; inCur {
		sh.cur[key] = d
	} else {
		sh.old[key] = d
	}
	return dryKey{}, false, true
}

// land ends key's flight with ch, once its answer is noted.
func (m *dryMemory) land(key string, ch chan struct{}) {
	if m == nil || ch == nil {
		return
	}
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.flight[key] == ch {
		delete(sh.flight, key)
	}
}

// note records the store's answer g to an ask of key under l, received at
// at: dry until the bucket holds one cost again, trusted for at most limit.
// Any other answer forgets the key. The store acted before at, so the
// bucket may refill up to the store's round trip earlier than remembered:
// an ask in that moment is denied (the token waits in the bucket for the
// next), where one counted from the sending would reach the store early
// and be denied there, an operation for nothing.
func (m *dryMemory) note(key string, g *lease.Grant, l lease.Limit, at int64, limit time.Duration) (until int64, dry bool) {
	if m == nil {
		return 0, false
	}
	var wait time.Duration
	switch {
	case g.Err != nil:
	case g.Granted == 0:
		wait = g.RetryAfter
	case !l.Fixed() && g.Tokens < float64(l.Cost) && g.Rate > 0:
		// A fixed window refills only at its end, which a denial's hint
		// tells.
		wait = time.Duration(min((float64(l.Cost)-max(g.Tokens, 0))/g.Rate*1e9, float64(lease.MaxRetryAfter)))
	}
	// The hint is the store's, rounded up to its microsecond clock, and
	// counted here from the answer's arrival: the remembered time is never
	// before the bucket holds a cost again. (A microsecond less, as this
	// once took, let a probe reach a bucket a rounding short of its token:
	// a store operation that admitted nothing, TestEndToEndLongTail's extra
	// script call.)
	if wait <= 0 || limit <= 0 {
		m.forget(key)
		return 0, false
	}
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.cur[key]; !ok && len(sh.cur) >= m.half {
		sh.old, sh.cur = sh.cur, make(map[string]dryKey, m.half)
	}
	delete(sh.old, key)
	step := limit
	if g.Rate > 0 && !l.Fixed() {
		step = min(time.Duration(float64(l.Cost)/g.Rate*1e9), limit)
	}
	sh.cur[key] = dryKey{until: at + int64(wait), trust: at + int64(min(wait, limit)), step: int64(step), rate: g.Rate, capacity: g.Capacity}
	return at + int64(wait), true
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
		sh.cur, sh.old = make(map[string]dryKey), nil // flights land as they end
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
