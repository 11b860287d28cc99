package lease

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
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
}

// MemoryStore is the allocator contract (DESIGN.md, "Level 1") in Go: the
// embedded default store and the simulator's. It is safe for concurrent use.
//
// The core methods (GrantAt, ReturnAt, SetSharesAt, Sweep) take the store's
// time as an argument; Grant, Return and SetShares read the configured
// Clock. A clock that moves backwards is clamped per bucket: it adds no
// tokens and takes none. Buckets vanish once idle for 2 × capacity / rate,
// exactly as the Redis store expires them; Sweep frees their memory.
// Applied shares never expire.
type MemoryStore struct {
	clock  func() time.Time
	seed   maphash.Seed
	shards []memShard
}

type memShard struct {
	mu      sync.Mutex
	buckets map[string]memBucket
	shares  map[string]int64
	// Pads shards apart so that neighbouring locks do not share a cache line.
	_ [64]byte
}

type memBucket struct {
	bucket
	// expireAt is when the bucket vanishes, in ms on the store clock; 0 is
	// never.
	expireAt int64
}

// NewMemoryStore returns an empty store.
func NewMemoryStore(cfg MemoryConfig) *MemoryStore {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Shards < 1 {
		cfg.Shards = 64
	}
	m := &MemoryStore{clock: cfg.Clock, seed: maphash.MakeSeed(), shards: make([]memShard, cfg.Shards)}
	for i := range m.shards {
		m.shards[i].buckets = make(map[string]memBucket)
		m.shards[i].shares = make(map[string]int64)
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
		share := s.share(r.Key, r.Limit)
		rate, capacity := r.Limit.Regional(share)
		b := s.load(r.Key, nowUS, capacity, r.Limit.StartEmpty)
		b.refill(nowUS, rate, capacity)
		granted := b.take(r.Want, r.Limit.Cost)
		s.store(r.Key, b, rate, capacity)
		s.mu.Unlock()
		out[i] = grantResult(r.Limit, share, granted, b.tokens)
	}
}

// ReturnAt credits returned tokens at store time now, each bucket capped at
// its capacity. The batch is all or nothing: if any item is invalid it
// returns an error wrapping ErrInvalid and changes nothing.
func (m *MemoryStore) ReturnAt(now time.Time, reqs []ReturnRequest) error {
	if err := validateAll(reqs, validateReturn); err != nil {
		return err
	}
	nowUS := now.UnixMicro()
	for _, r := range reqs {
		s := m.shard(r.Key)
		s.mu.Lock()
		rate, capacity := r.Limit.Regional(s.share(r.Key, r.Limit))
		b := s.load(r.Key, nowUS, capacity, r.Limit.StartEmpty)
		b.refill(nowUS, rate, capacity)
		b.give(r.Tokens, capacity)
		s.store(r.Key, b, rate, capacity)
		s.mu.Unlock()
	}
	return nil
}

// SetSharesAt applies shares at store time now. A bucket is first refilled
// at its old rate up to now, then switches to the new rate and capacity,
// its tokens clipped to the new capacity: lowering a share takes effect at
// once. A key without a bucket only records the share (its bucket will
// start at the new capacity). The batch is all or nothing: if any item is
// invalid it returns an error wrapping ErrInvalid and changes nothing.
func (m *MemoryStore) SetSharesAt(now time.Time, ups []ShareUpdate) error {
	if err := validateAll(ups, validateShare); err != nil {
		return err
	}
	nowUS := now.UnixMicro()
	for _, u := range ups {
		s := m.shard(u.Key)
		s.mu.Lock()
		oldRate, oldCapacity := u.Limit.Regional(s.share(u.Key, u.Limit))
		s.shares[u.Key] = u.SharePPM
		if mb, ok := s.buckets[u.Key]; ok {
			if expired(mb.expireAt, nowUS) {
				delete(s.buckets, u.Key)
			} else {
				b := mb.bucket
				b.refill(nowUS, oldRate, oldCapacity)
				rate, capacity := u.Limit.Regional(u.SharePPM)
				b.tokens = min(b.tokens, capacity)
				s.store(u.Key, b, rate, capacity)
			}
		}
		s.mu.Unlock()
	}
	return nil
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
		for k, b := range s.buckets {
			if expired(b.expireAt, nowUS) {
				delete(s.buckets, k)
				n++
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

// SetShares is SetSharesAt at the configured clock's time.
func (m *MemoryStore) SetShares(ctx context.Context, ups []ShareUpdate) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return m.SetSharesAt(m.clock(), ups)
}

// Shares writes the applied share in ppm of each key to out, which must
// have len(keys) elements; -1 means no share was ever applied (the key runs
// at its Limit.InitialShare).
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
	for i, k := range keys {
		s := m.shard(k)
		s.mu.Lock()
		v, ok := s.shares[k]
		s.mu.Unlock()
		if !ok {
			v = -1
		}
		out[i] = v
	}
	return nil
}

// Ping reports whether the store can serve: a memory store always can.
func (m *MemoryStore) Ping(ctx context.Context) error {
	return ctx.Err()
}

// share is the key's applied share, else the limit's initial share. The
// caller holds s.mu.
func (s *memShard) share(key string, l Limit) int64 {
	if v, ok := s.shares[key]; ok {
		return v
	}
	return l.InitialShare
}

// load returns the key's bucket, or a new one if it is missing or expired
// (as a Redis key would be). The caller holds s.mu.
func (s *memShard) load(key string, nowUS int64, capacity float64, startEmpty bool) bucket {
	if b, ok := s.buckets[key]; ok && !expired(b.expireAt, nowUS) {
		return b.bucket
	}
	return newBucket(nowUS, capacity, startEmpty)
}

// store saves b with its expiry. The caller holds s.mu.
func (s *memShard) store(key string, b bucket, rate, capacity float64) {
	s.buckets[key] = memBucket{bucket: b, expireAt: expireAtMillis(b.last, rate, capacity)}
}
