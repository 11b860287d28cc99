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
// the key where this service sees them (Forget, Return). One wait is on
// purpose: a hot key's asks are held to a grid of instants less than a
// refill step beyond the store's (phaseDelay; Config.NoSpacing turns it
// off), spending the same tokens later. It is bounded in
// time (Config.DryFor, and the sync period for global keys) and in keys
// (Config.DryKeys: the oldest half is dropped when full). Once it is no
// longer trusted one ask probes the store while the others wait a refill's
// time, and concurrent asks for a key that one call is asking the store for
// wait for that answer (claim): a herd costs one store operation.
//
// Asks for a key go to the store together only while what its last answer
// left covers them (the flight's left): a herd woken by an answer that left
// one token sends one ask, not one each, since the others would reach an
// empty bucket, a store operation that admits nothing. The rest wait for
// the next answer, which either covers them or leaves the key dry.

// dryShards spreads the memory over locks: every Lease call looks its keys up.
const dryShards = 64

// dryKey is what the service remembers of a dry bucket: until when it
// cannot grant at the rate it had (Clock nanoseconds), which a denial's
// retry hint tells, until when the memory is trusted (at most the limit
// after the answer), the time a cost takes to refill (step), its rate and
// capacity, which a denial reports, and whether an ask let through once
// trust passed is still on its way to the store (probing).
//
// A wet entry (until 0) instead holds what an answer left (left) for asks
// that waited for it, until trust; it never denies.
type dryKey struct {
	// noted is when the answer that set the entry came back.
	until, trust, step, noted int64
	rate, capacity            float64
	left                      float64
	probing                   bool
	// spaced: until was held to the key's grid (phaseDelay).
	spaced bool
}

// keyFlight is a key's asks on their way to the store: how many, what they
// want, what the bucket holds beyond that as far as the answers so far tell
// (left; nothing known is 0), and the channel closed at the next answer for
// asks waiting for it (nil while none does).
type keyFlight struct {
	n     int
	wants int64
	left  float64
	done  chan struct{}
	// low is the least an answer of the flight left (answered, whether
	// any was): answers may be noted out of the store's order, and the
	// least is the safe one to leave in a wet entry.
	low      float64
	answered bool
}

type dryShard struct {
	mu       sync.Mutex
	cur, old map[string]dryKey
	// flight holds the keys asked of the store now: a concurrent ask that
	// what they leave may not cover waits for their next answer rather than
	// asking too (claim).
	flight map[string]keyFlight
}

// dryMemory is the service's memory of dry keys. The zero value is not
// usable; see newDryMemory. A nil *dryMemory remembers nothing.
type dryMemory struct {
	seed maphash.Seed
	// phase is this region's seed of the grids that space its asks for
	// hot keys (phaseDelay), when spaced.
	phase  uint64
	spaced bool
	half   int // entries a shard's cur holds before it becomes old
	shards [dryShards]dryShard
}

func newDryMemory(keys int, region string, spaced bool) *dryMemory {
	if keys <= 0 {
		return nil
	}
	m := &dryMemory{seed: maphash.MakeSeed(), phase: fnv1a(fnvOffset, region), spaced: spaced, half: max(keys/dryShards/2, 1)}
	for i := range m.shards {
		m.shards[i].cur = make(map[string]dryKey)
		m.shards[i].flight = make(map[string]keyFlight)
	}
	return m
}

func (m *dryMemory) shard(key string) *dryShard {
	return &m.shards[maphash.String(m.seed, key)%dryShards]
}

// claim decides an ask of key for want tokens of cost at now: dry, with
// what is remembered; or asks for key are on their way to the store and
// what they leave may not cover this one, and wait is closed at their next
// answer (then decide again); or the ask goes to the store (a probe when it
// is the one let through as trust passed), in flight until land. A nil
// memory sends every ask.
//
// Dry means trusted dry, or, within a step after trust, while the one ask
// let through then (the probe) is on its way to the store: a bucket that
// held less than a cost when trust passed holds less than two a step later,
// and the probe asks for at least one, so the store would deny the others
// too.
func (m *dryMemory) claim(key string, want, cost, now int64) (d dryKey, dry bool, wait chan struct{}, probe bool) {
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
	f, ok := sh.flight[key]
	switch {
	case ok && f.left < float64(cost):
		// What the asks in flight leave may be less than a cost: their
		// answer tells.
		if f.done == nil {
			f.done = make(chan struct{})
			sh.flight[key] = f
		}
		if probe {
			sh.unprobeLocked(key) // not sent: the next ask probes
		}
		return dryKey{}, false, f.done, false
	case !ok:
		// The first ask in flight: what the last answer left, when asks
		// waited for it, else nothing known.
		if w, wet := sh.wetLocked(key, now); wet {
			f.left = w.left
		}
	}
	f.n++
	f.wants += want
	f.left -= float64(want)
	sh.flight[key] = f
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
	case !ok, d.until == 0: // a wet entry never denies
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

// unprobeLocked undoes dryLocked's probe mark on key (sh.mu held).
func (sh *dryShard) unprobeLocked(key string) {
	if d, ok := sh.cur[key]; ok {
		d.probing = false
		sh.cur[key] = d
	} else if d, ok := sh.old[key]; ok {
		d.probing = false
		sh.old[key] = d
	}
}

// wetLocked returns key's wet entry, what an answer left (sh.mu held). It
// stays: the flight it starts refreshes it when it lands (land), so that
// an ask woken by the same answer that claims after that flight ended
// still knows what is left rather than nothing.
func (sh *dryShard) wetLocked(key string, now int64) (dryKey, bool) {
	d, ok := sh.cur[key]
	if !ok {
		d, ok = sh.old[key]
	}
	if !ok || d.until != 0 {
		return dryKey{}, false
	}
	return d, now < d.trust
}

// land ends an ask of key for want tokens that claim sent, once its answer
// is noted: tokens are what the bucket held after it (known false: the
// store failed). It wakes the asks waiting for key; when it was the last
// in flight and they were, or it was started by a wet entry, the least its
// answers left stays for the asks after it (a wet entry, for at most
// limit, and only where note left the key not dry: a dry key is answered
// from memory).
func (m *dryMemory) land(key string, want int64, tokens float64, known bool, at int64, limit time.Duration) {
	if m == nil {
		return
	}
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	f, ok := sh.flight[key]
	if !ok {
		return // forgotten by clear
	}
	f.n--
	f.wants -= want
	// Asks still in flight may have reached the store before this one,
	// so tokens may already lack their wants: counting them off again
	// errs low, which only makes an ask wait.
	f.left = 0
	if known {
		f.left = tokens - float64(f.wants)
		if !f.answered || tokens < f.low {
			f.low, f.answered = tokens, true
		}
	}
	woken := f.done != nil
	if woken {
		close(f.done)
		f.done = nil
	}
	if f.n > 0 {
		sh.flight[key] = f
		return
	}
	delete(sh.flight, key)
	e, inCur := sh.cur[key]
	inOld := false
	if !inCur {
		e, inOld = sh.old[key]
	}
	wet := (inCur || inOld) && e.until == 0
	switch {
	case (inCur || inOld) && !wet:
		return // note left the key dry
	case !known || limit <= 0:
		if wet {
			delete(sh.cur, key)
			delete(sh.old, key)
		}
		return
	case !woken && !wet:
		return
	}
	delete(sh.old, key)
	if !inCur && len(sh.cur) >= m.half {
		sh.old, sh.cur = sh.cur, make(map[string]dryKey, m.half)
	}
	sh.cur[key] = dryKey{trust: at + int64(limit), left: f.low, noted: at}
}

// note records the store's answer g to an ask of key under l, sent at
// sent and received at at: dry until the bucket holds one cost again,
// trusted for at most limit. Any other answer forgets the key, unless an
// answer noted since sent remembers it: asks of one key in flight together
// may be noted in another order than the store answered them, and only the
// memory's denials are safe to keep on a stale answer (forgetting a newer
// dry answer, or replacing it with an older, earlier one, let an ask reach
// an empty bucket: TestEndToEndLongTail's rare extra script call). The store acted before at, so the
// bucket may refill up to the store's round trip earlier than remembered:
// an ask in that moment is denied (the token waits in the bucket for the
// next), where one counted from the sending would reach the store early
// and be denied there, an operation for nothing.
func (m *dryMemory) note(key string, g *lease.Grant, l lease.Limit, sent, at int64, limit time.Duration) (until int64, dry bool) {
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
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	prev, had := sh.cur[key]
	if !had {
		prev, had = sh.old[key]
	}
	newer := had && prev.noted >= sent
	spaced := false
	if m.spaced && wait > 0 && had && prev.until != 0 && !newer {
		// Asked for as soon as it could grant again: a hot key, which
		// stays on its grid while it is asked for within every step
		// (a key that keeps to it only now and then admits less evenly
		// than one that never does).
		if lag := sent - prev.until; lag < prev.step/8 || prev.spaced && lag < prev.step {
			var delay time.Duration
			delay, spaced = m.phaseDelay(key, at+int64(wait), g, l)
			wait += delay
		}
	}
	if wait <= 0 || limit <= 0 {
		// A wet entry is land's to refresh.
		if had && prev.until != 0 && !newer {
			delete(sh.cur, key)
			delete(sh.old, key)
		}
		return 0, false
	}
	if newer && prev.until > at+int64(wait) {
		return prev.until, true
	}
	if _, ok := sh.cur[key]; !ok && len(sh.cur) >= m.half {
		sh.old, sh.cur = sh.cur, make(map[string]dryKey, m.half)
	}
	delete(sh.old, key)
	step := limit
	if g.Rate > 0 && !l.Fixed() {
		step = min(time.Duration(float64(l.Cost)/g.Rate*1e9), limit)
	}
	sh.cur[key] = dryKey{until: at + int64(wait), trust: at + int64(min(wait, limit)), step: int64(step), noted: at, rate: g.Rate, capacity: g.Capacity, spaced: spaced}
	return at + int64(wait), true
}

// phaseDelay is how long after until, when a dry bucket holds a whole cost
// again, the memory keeps denying key so that the region's asks fall on
// its grid for the key: the instants that are, modulo the time a cost
// takes to refill at the rate g tells (step), a fraction of it hashed from
// the region and the key. A hot key's bucket is emptied by the first ask
// after each refill; regions whose buckets were emptied together (at a
// start, or at the epoch that set their shares) then admit in step,
// several regions' costs at the same instant and none between, so that
// the key's one-second counts swing around its limit. On independent grids
// the regions' admissions interleave instead. (Hashed, not spaced by an
// agreed order: the regions' steps differ with their shares, so any
// agreed spacing would drift apart anyway.)
//
// It is only taken where it can matter and costs nothing: the region holds
// at most half the key's quota (others admit as much beside it) and takes
// at least minSpacedStep to refill a cost; the delay is less than a step;
// and the bucket can hold a further step's refill, and at least a
// second's, after it (its capacity, at the rate it has): a token that
// waits is spent by a hot key's next ask, and lost only if the key then
// goes that long unasked. The memory only denies, so the bound is
// untouched; the tokens are spent later, not fewer. (A scope: region key
// holds its whole quota, so only global keys are spaced.)
func (m *dryMemory) phaseDelay(key string, until int64, g *lease.Grant, l lease.Limit) (time.Duration, bool) {
	if l.Fixed() || g.Err != nil || g.Rate <= 0 || g.Rate > l.Rate/2 {
		return 0, false
	}
	step := float64(l.Cost) / g.Rate * 1e9
	room := (g.Capacity - float64(l.Cost)) / g.Rate * 1e9
	if step < float64(minSpacedStep) || room <= 0 || step > float64(lease.MaxRetryAfter) {
		return 0, false
	}
	n := int64(step)
	anchor := int64(float64(fnv1a(m.phase, key)>>11) / (1 << 53) * float64(n))
	delay := ((anchor-until%n)%n + n) % n
	if float64(delay) > room-max(step, float64(time.Second)) {
		return 0, false
	}
	return time.Duration(delay), true
}

// minSpacedStep is the shortest step phaseDelay spaces: a region that
// refills a cost faster admits so many a second that where in the step it
// does is lost in the count.
const minSpacedStep = 10 * time.Millisecond

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnv1a continues the FNV-1a hash h over s: a phase must be the same in
// every run and replica, which maphash's random seeds are not.
func fnv1a(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
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
