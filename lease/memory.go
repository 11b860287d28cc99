package lease

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// MemoryConfig configures a MemoryStore. The zero value is ready to use.
type MemoryConfig struct {
	// Clock is read by the context-taking methods (Grant, Return,
	// SetShares); the ...At methods take the time as an argument instead.
	// Default time.Now.
	Clock func() time.Time
	// Shards is how many independently locked partitions hold the keys, so
	// that goroutines working on different keys rarely wait for each other.
	// Default 64; values below 1 mean the default.
	Shards int
	// ShareTTL is how long an applied share lasts after its latest write
	// (SetShares), as RedisConfig.ShareTTL: never less than its bucket,
	// which keeps it while it does not expire. The exchange rewrites each
	// share at least every ShareTTL/2. Rounded up to whole milliseconds,
	// at most 2^40 ms. Default 24h; values below 1 mean the default.
	ShareTTL time.Duration
}

// withDefaults returns c with every zero (or, for Shards and ShareTTL,
// non-positive) field set to its default and ShareTTL capped: every
// MemoryConfig is valid.
func (c MemoryConfig) withDefaults() MemoryConfig {
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Shards < 1 {
		c.Shards = 64
	}
	if c.ShareTTL < 1 {
		c.ShareTTL = DefaultShareTTL
	}
	c.ShareTTL = min(c.ShareTTL, maxTTLMillis*time.Millisecond)
	return c
}

// shareTTLMillis is a ShareTTL in whole milliseconds, rounded up.
func shareTTLMillis(d time.Duration) int64 {
	return ceilDiv(int64(d), int64(time.Millisecond))
}

// MemoryStore is the allocator contract (DESIGN.md, "Level 1") in Go: the
// embedded default store and the simulator's. It is safe for concurrent use.
//
// The core methods (GrantAt, ReturnAt, SetSharesAt, Sweep) take the store's
// time as an argument; Grant, Return and SetShares read the configured
// Clock. A clock that moves backwards is clamped per bucket: it adds no
// tokens and takes none. Buckets vanish once idle for 2 × capacity / rate
// (never at rate 0, or when that is above 2^40 ms), exactly as the Redis
// store expires them; an applied share lasts MemoryConfig.ShareTTL after
// its latest write, or as long as its bucket if that is longer, as the
// Redis store keeps it. Sweep frees their memory. Answers are bit for bit
// those of RedisStore given the same state and elapsed time.
type MemoryStore struct {
	clock      func() time.Time
	shareTTLMS int64
	seed       maphash.Seed
	shards     []memShard
	// restores counts Restore calls: the store's Incarnation.
	restores atomic.Uint64
}

type memShard struct {
	mu sync.Mutex
	// keys holds one entry per key with a bucket or an applied share: one
	// map lookup per grant, and the entry is updated in place.
	keys map[string]*memEntry
	// Pads shards apart so that neighbouring locks do not share a cache line.
	_ [64]byte
}

// memEntry is a key's state: its bucket and its applied share, each with
// its expiry.
type memEntry struct {
	bucket
	// expireAt is when the bucket vanishes, in ms on the store clock; 0 is
	// never.
	expireAt int64
	// shareExpireAt is, with a share, when the key vanishes with its share
	// (shareExpireAtMillis; never before expireAt), in ms; 0 is never.
	shareExpireAt int64
	escrow        // lives and expires with the share
	share         int32
	hasBucket     bool
	hasShare      bool
}

// live reports whether the entry holds a bucket that has not expired at
// nowUS; an expired bucket counts as missing, as a Redis key would.
func (e *memEntry) live(nowUS int64) bool {
	return e.hasBucket && !expired(e.expireAt, nowUS)
}

// forget drops a share that has expired at nowUS, as Redis drops the key
// that holds it (its bucket expired no later).
func (e *memEntry) forget(nowUS int64) {
	if e.hasShare && expired(e.shareExpireAt, nowUS) {
		e.hasShare, e.share, e.escrow = false, 0, escrow{}
	}
}

// NewMemoryStore returns an empty store.
func NewMemoryStore(cfg MemoryConfig) *MemoryStore {
	cfg = cfg.withDefaults()
	m := &MemoryStore{clock: cfg.Clock, shareTTLMS: shareTTLMillis(cfg.ShareTTL), seed: maphash.MakeSeed(), shards: make([]memShard, cfg.Shards)}
	for i := range m.shards {
		m.shards[i].keys = make(map[string]*memEntry)
	}
	return m
}

func (m *MemoryStore) shard(key string) *memShard {
	return &m.shards[maphash.String(m.seed, key)%uint64(len(m.shards))]
}

// GrantAt answers reqs in order at store time now, writing one Grant per
// request to out, which must have len(reqs) elements (it panics otherwise,
// like an index out of range). An invalid item gets a Grant with Err set
// (wrapping ErrInvalid) and debits nothing; the other items proceed.
// Several items for one key are applied one after the other.
//
// Grants are whole multiples of Limit.Cost, so a Want below the cost is
// invalid, and a Want that is not a multiple is rounded down. At share 0
// (rate 0) a bucket holds one cost, never refills and never expires, and
// RetryAfter is NoRefillRetryAfter. An empty fixed window's RetryAfter is the
// time to its end (at most MaxRetryAfter); an item whose fixed window does
// not span now gets an error wrapping ErrInvalid.
func (m *MemoryStore) GrantAt(now time.Time, reqs []GrantRequest, out []Grant) {
	if len(out) != len(reqs) {
		panic(fmt.Sprintf("lease: GrantAt with %d requests and %d results", len(reqs), len(out)))
	}
	nowUS := now.UnixMicro()
	for i, r := range reqs {
		if err := validateGrant(r); err != nil {
			out[i] = Grant{Err: err}
			continue
		}
		s := m.shard(r.Key)
		s.mu.Lock()
		e := s.entry(r.Key, nowUS)
		raised := r.Raise != nil
		if raised {
			e.raise(nowUS, r.Key, r.Limit, r.Raise, m.shareTTLMS)
		}
		share := e.shareOr(r.Limit)
		rate, capacity := r.Limit.Regional(share)
		end, ok := e.bringForward(nowUS, r.Limit, rate, capacity)
		if !ok {
			s.mu.Unlock()
			out[i] = Grant{Err: fmt.Errorf("key %q: %w", r.Key, errClockOutsideWindow)}
			continue
		}
		capped := r.MaxShare > 0 && share > r.MaxShare
		if capped {
			// Brought forward at the old share, as a share update is.
			share = r.MaxShare
			e.share, e.hasShare = int32(share), true
			rate, capacity = r.Limit.Regional(share)
			e.reshare(0, capacity)
		}
		granted := e.take(r.Want, r.Limit.Cost)
		e.setExpiry(rate, capacity, end, m.shareTTLMS, capped || raised)
		tokens, last := e.tokens, e.last
		s.mu.Unlock()
		out[i] = grantResult(r.Limit, share, granted, tokens, end-last)
	}
}

// ReturnAt credits returned tokens at store time now, each bucket capped at
// its capacity. The batch is all or nothing: if any item is invalid (or its
// fixed window does not span now) it returns an error wrapping ErrInvalid
// and changes nothing.
func (m *MemoryStore) ReturnAt(now time.Time, reqs []ReturnRequest) error {
	nowUS := now.UnixMicro()
	if err := validateAll(reqs, func(r ReturnRequest) error { return m.validateAt(validateReturn(r), r.Key, r.Limit, nowUS) }); err != nil {
		return err
	}
	for _, r := range reqs {
		s := m.shard(r.Key)
		s.mu.Lock()
		e := s.entry(r.Key, nowUS)
		rate, capacity := r.Limit.Regional(e.shareOr(r.Limit))
		end, _ := e.bringForward(nowUS, r.Limit, rate, capacity)
		e.give(r.Tokens, capacity)
		e.setExpiry(rate, capacity, end, m.shareTTLMS, false)
		s.mu.Unlock()
	}
	return nil
}

// validateAt adds to a valid item's check that its fixed window, if any,
// spans the store's clock (clamped to the bucket's last update, as
// bucket.advance clamps it).
func (m *MemoryStore) validateAt(err error, key string, l Limit, nowUS int64) error {
	if err != nil || !l.Fixed() {
		return err
	}
	s := m.shard(key)
	s.mu.Lock()
	if e, ok := s.keys[key]; ok && e.live(nowUS) {
		nowUS = max(nowUS, e.last)
	}
	s.mu.Unlock()
	if _, _, ok := l.windowAt(nowUS); !ok {
		return fmt.Errorf("key %q: %w", key, errClockOutsideWindow)
	}
	return nil
}

// SetSharesAt applies shares at store time now, writing one ShareResult
// per update to out unless out is nil (it panics when out is not nil and
// has another length, like an index out of range). A bucket is first
// refilled at its old rate up to now (a key without one gets the bucket it
// stands for: full at the old capacity, or empty for Limit.StartEmpty),
// credited the tokens received that it has not had yet, then switches to
// the new rate and capacity; the tokens above the new capacity leave it
// (ShareResult.Released). The batch is all or nothing: if any item is
// invalid it returns an error wrapping ErrInvalid and changes nothing.
func (m *MemoryStore) SetSharesAt(now time.Time, ups []ShareUpdate, out []ShareResult) error {
	if out != nil && len(out) != len(ups) {
		panic(fmt.Sprintf("lease: SetSharesAt with %d updates and %d results", len(ups), len(out)))
	}
	nowUS := now.UnixMicro()
	if err := validateAll(ups, func(u ShareUpdate) error { return m.validateAt(validateShare(u), u.Key, u.Limit, nowUS) }); err != nil {
		return err
	}
	for i, u := range ups {
		s := m.shard(u.Key)
		s.mu.Lock()
		r := s.entry(u.Key, nowUS).setShare(nowUS, u, m.shareTTLMS)
		s.mu.Unlock()
		if out != nil {
			out[i] = r
		}
	}
	return nil
}

// raise applies a grant's raise (GrantRequest.Raise): its steps as share
// writes when each was set would have (step), the last with its tokens.
func (e *memEntry) raise(nowUS int64, key string, l Limit, r *ShareRaise, holdMS int64) {
	e.restart(nowUS, l, r.Steps)
	live, last := e.live(nowUS), len(r.Steps)-1
	e.step(nowUS, l, r.Steps[:last])
	at := nowUS
	if live {
		at = max(e.last, nowUS-r.Steps[last].Age.Microseconds())
	}
	e.setShare(at, ShareUpdate{Key: key, SharePPM: r.Steps[last].SharePPM, Limit: l, Gen: r.Gen, Received: r.Received}, holdMS)
}

// step sets each share of steps as a share write at its time would have
// (bucket.lua), dropping what it releases: at max(last, now − Age), or at
// now for a bucket missing now, which starts at the share in force. The
// caller restarts the bucket first (restart).
func (e *memEntry) step(nowUS int64, l Limit, steps []ShareStep) {
	live := e.live(nowUS)
	for _, st := range steps {
		at := nowUS
		if live {
			at = max(e.last, nowUS-st.Age.Microseconds())
		}
		rate, capacity := l.Regional(e.shareOr(l))
		e.bringForward(at, l, rate, capacity)
		e.share, e.hasShare = int32(st.SharePPM), true
		_, capacity = l.Regional(st.SharePPM)
		e.reshare(0, capacity)
	}
}

// restart starts, for steps, the bucket of a key that keeps a share past
// its bucket's expiry, which was full from then on: at the later of then
// and the oldest step, at the share in force (bucket.lua).
func (e *memEntry) restart(nowUS int64, l Limit, steps []ShareStep) {
	if len(steps) == 0 || e.live(nowUS) || !e.hasShare || e.expireAt <= 0 || l.StartEmpty {
		return
	}
	if from := max(e.expireAt*1000, nowUS-steps[0].Age.Microseconds()); from < nowUS {
		_, capacity := l.Regional(e.shareOr(l))
		// Live until the operation sets its expiry (setExpiry).
		e.bucket, e.hasBucket, e.expireAt = newBucket(from, capacity, false, 0), true, 0
	}
}

// setShare is SetSharesAt for one valid update; the caller holds the lock.
func (e *memEntry) setShare(nowUS int64, u ShareUpdate, holdMS int64) ShareResult {
	if len(u.Steps) > 0 {
		e.restart(nowUS, u.Limit, u.Steps)
		e.step(nowUS, u.Limit, u.Steps)
	}
	oldRate, oldCapacity := u.Limit.Regional(e.shareOr(u.Limit))
	end, _ := e.bringForward(nowUS, u.Limit, oldRate, oldCapacity)
	credit := e.escrow.credit(u, e.bucket.win)
	e.share, e.hasShare = int32(u.SharePPM), true
	rate, capacity := u.Limit.Regional(u.SharePPM)
	r := ShareResult{Released: e.reshare(credit, capacity), Window: e.bucket.win}
	e.setExpiry(rate, capacity, end, holdMS, true)
	r.Tokens = e.tokens
	return r
}

// Sweep drops the buckets that have expired at store time now and returns
// how many it dropped, so that memory follows the active keys. An expired
// bucket already counts as missing, so dropping it changes no answer,
// unless the clock later goes back before its expiry: a dropped bucket then
// starts afresh where a kept one would be clamped. Redis, which deletes
// expired keys when it chooses, behaves the same way.
func (m *MemoryStore) Sweep(now time.Time) int {
	nowUS := now.UnixMicro()
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		for k, e := range s.keys {
			e.forget(nowUS)
			if e.hasBucket && !e.live(nowUS) {
				n++
				e.hasBucket = false
			}
			if !e.hasBucket && !e.hasShare {
				delete(s.keys, k)
			}
		}
		s.mu.Unlock()
	}
	return n
}

// Grant is GrantAt at the configured clock's time. It returns an error
// (wrapping ErrInvalid) only when len(out) != len(reqs), or the context's
// error when ctx is already done; per-item errors are in out.
func (m *MemoryStore) Grant(ctx context.Context, reqs []GrantRequest, out []Grant) error {
	if len(out) != len(reqs) {
		return fmt.Errorf("%w: %d requests and %d results", ErrInvalid, len(reqs), len(out))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.GrantAt(m.clock(), reqs, out)
	return nil
}

// Return is ReturnAt at the configured clock's time.
func (m *MemoryStore) Return(ctx context.Context, reqs []ReturnRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return m.ReturnAt(m.clock(), reqs)
}

// SetShares is SetSharesAt at the configured clock's time. It returns an
// error wrapping ErrInvalid when out is not nil and len(out) != len(ups).
func (m *MemoryStore) SetShares(ctx context.Context, ups []ShareUpdate, out []ShareResult) error {
	if out != nil && len(out) != len(ups) {
		return fmt.Errorf("%w: %d updates and %d results", ErrInvalid, len(ups), len(out))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return m.SetSharesAt(m.clock(), ups, out)
}

// Shares writes the applied share in ppm of each key to out, which must
// have len(keys) elements, at the configured clock's time; -1 means no
// share was applied or it expired (the key runs at its Limit.InitialShare).
func (m *MemoryStore) Shares(ctx context.Context, keys []string, out []int64) error {
	if len(out) != len(keys) {
		return fmt.Errorf("%w: %d keys and %d results", ErrInvalid, len(keys), len(out))
	}
	if err := validateAll(keys, validateKey); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	nowUS := m.clock().UnixMicro()
	for i, k := range keys {
		s := m.shard(k)
		s.mu.Lock()
		v := int64(-1)
		if e, ok := s.keys[k]; ok && e.hasShare && !expired(e.shareExpireAt, nowUS) {
			v = int64(e.share)
		}
		s.mu.Unlock()
		out[i] = v
	}
	return nil
}

// Ping reports whether the store can serve: a memory store always can.
func (m *MemoryStore) Ping(ctx context.Context) error {
	return ctx.Err()
}

// entry returns key's entry at nowUS, adding an empty one. The caller
// holds s.mu.
func (s *memShard) entry(key string, nowUS int64) *memEntry {
	e, ok := s.keys[key]
	if !ok {
		e = &memEntry{}
		s.keys[key] = e
	}
	e.forget(nowUS)
	return e
}

// shareOr is the key's applied share, else the limit's initial share.
func (e *memEntry) shareOr(l Limit) int64 {
	if e.hasShare {
		return int64(e.share)
	}
	return l.InitialShare
}

// bringForward starts a new bucket if the key has none at nowUS (missing or
// expired, as a Redis key would be) and brings it forward to nowUS
// (bucket.advance), returning a fixed window's end; ok is false when the
// fixed window does not span nowUS, and then nothing changed.
func (e *memEntry) bringForward(nowUS int64, l Limit, rate, capacity float64) (end int64, ok bool) {
	if !e.live(nowUS) {
		var win int64
		if l.Fixed() {
			if win, _, ok = l.windowAt(nowUS); !ok {
				return 0, false
			}
		}
		e.bucket = newBucket(nowUS, capacity, l.StartEmpty, win)
		e.hasBucket = true
	}
	return e.advance(nowUS, l, rate, capacity)
}

// setExpiry sets when the bucket, just updated, may vanish (a fixed window
// ending at end, not 0: then), and when its share may (written: by a share
// write, lasting holdMS).
func (e *memEntry) setExpiry(rate, capacity float64, end, holdMS int64, written bool) {
	e.expireAt = expireAtMillis(e.last, rate, capacity, end)
	if e.hasShare {
		e.shareExpireAt = shareExpireAtMillis(e.expireAt, e.shareExpireAt, e.last, holdMS, written)
	}
}

// DeleteShares is RedisStore.DeleteShares at the configured clock's time:
// the keys' buckets fall back to Limit.InitialShare and expire as their
// own, and an entry left without a live bucket is freed.
func (m *MemoryStore) DeleteShares(ctx context.Context, keys []string) error {
	if err := validateAll(keys, validateKey); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	nowUS := m.clock().UnixMicro()
	for _, k := range keys {
		s := m.shard(k)
		s.mu.Lock()
		if e, ok := s.keys[k]; ok {
			e.hasShare, e.share, e.escrow, e.shareExpireAt = false, 0, escrow{}, 0
			if !e.live(nowUS) {
				delete(s.keys, k)
			}
		}
		s.mu.Unlock()
	}
	return nil
}

// BucketState is what a store holds for one key, as PeekAt reads it.
type BucketState struct {
	// Tokens is the balance a grant would find now: refilled, and for a
	// key without a bucket the one it stands for (full at its capacity, or
	// empty for Limit.StartEmpty).
	Tokens float64
	// Rate and Capacity are the bucket's parameters at SharePPM, the
	// applied share in force (Limit.InitialShare when none was applied).
	Rate, Capacity float64
	SharePPM       int64
	// Gen and Credited are the escrow's: the newest exchange generation
	// whose tokens the store credited, and how many (region.TokenScale).
	Gen      uint64
	Credited int64
}

// PeekAt returns key's state at store time now for limit l, changing
// nothing.
func (m *MemoryStore) PeekAt(now time.Time, key string, l Limit) BucketState {
	nowUS := now.UnixMicro()
	s := m.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	var b memEntry
	if e, ok := s.keys[key]; ok {
		b = *e // a copy: peeking changes nothing
	}
	b.forget(nowUS)
	share := b.shareOr(l)
	rate, capacity := l.Regional(share)
	b.bringForward(nowUS, l, rate, capacity)
	return BucketState{Tokens: b.tokens, Rate: rate, Capacity: capacity, SharePPM: share, Gen: b.gen, Credited: b.credited}
}
