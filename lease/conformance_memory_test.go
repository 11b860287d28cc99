package lease

import (
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a store clock that tests move by hand; safe for concurrent
// use so that the concurrent case can tick it from many goroutines.
type fakeClock struct{ ns atomic.Int64 }

// epoch is an arbitrary fixed start for fake clocks.
var epoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(epoch.UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func newMemoryHarness(t *testing.T) *harness {
	clock := newFakeClock()
	m := NewMemoryStore(MemoryConfig{Clock: clock.Now, Shards: 4, ShareTTL: confShareTTL})
	return &harness{
		store: m,
		now:   clock.Now,
		tick:  func() { clock.Advance(time.Millisecond) },
		bucketTTL: func(t *testing.T, key string) (time.Duration, bool) {
			s := m.shard(key)
			s.mu.Lock()
			defer s.mu.Unlock()
			nowUS := clock.Now().UnixMicro()
			b, ok := s.keys[key]
			if !ok || !b.live(nowUS) {
				return 0, false
			}
			if b.expireAt == 0 {
				return -1, true
			}
			// Like Redis PTTL: milliseconds until the expiry time.
			return time.Duration(b.expireAt-floorDiv(nowUS, 1000)) * time.Millisecond, true
		},
		setBucket: func(t *testing.T, key string, tokens float64, last time.Time) {
			s := m.shard(key)
			s.mu.Lock()
			defer s.mu.Unlock()
			e := s.entry(key, clock.Now().UnixMicro())
			e.bucket, e.hasBucket, e.expireAt = bucket{tokens: tokens, last: last.UnixMicro()}, true, 0
			if e.hasShare {
				e.shareExpireAt = 0
			}
		},
		keyTTL: func(t *testing.T, key string) (time.Duration, bool) {
			s := m.shard(key)
			s.mu.Lock()
			defer s.mu.Unlock()
			nowUS := clock.Now().UnixMicro()
			e, ok := s.keys[key]
			if !ok {
				return 0, false
			}
			b := *e
			b.forget(nowUS)
			exp := b.expireAt
			switch {
			case b.hasShare:
				exp = b.shareExpireAt
			case !b.live(nowUS):
				return 0, false
			}
			if exp == 0 {
				return -1, true
			}
			return time.Duration(exp-floorDiv(nowUS, 1000)) * time.Millisecond, true
		},
	}
}

func TestMemoryStoreConformance(t *testing.T) {
	runConformance(t, newMemoryHarness)
}
