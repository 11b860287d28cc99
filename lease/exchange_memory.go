package lease

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// MemoryExchange is the exchange lease and persisted exchange state of
// RedisStore (exchange.go) in memory, for the replicas of a region that
// share one process: the embedded default (one replica, which always gets
// the lease), tests and the simulator. It is safe for concurrent use; the
// zero value is not, use NewMemoryExchange.
type MemoryExchange struct {
	clock func() time.Time

	mu     sync.Mutex
	leases map[string]memLease
	states map[string][]byte
}

type memLease struct {
	holder string
	until  time.Time
}

// NewMemoryExchange returns an empty MemoryExchange whose leases expire by
// clock (default time.Now).
func NewMemoryExchange(clock func() time.Time) *MemoryExchange {
	if clock == nil {
		clock = time.Now
	}
	return &MemoryExchange{clock: clock, leases: make(map[string]memLease), states: make(map[string][]byte)}
}

// held reports whether holder holds region's lease at now. The caller
// holds m.mu.
func (m *MemoryExchange) held(region, holder string, now time.Time) bool {
	l, ok := m.leases[region]
	return ok && l.holder == holder && now.Before(l.until)
}

// AcquireExchange is RedisStore.AcquireExchange.
func (m *MemoryExchange) AcquireExchange(ctx context.Context, region, holder string, ttl time.Duration) (ExchangeHold, error) {
	if err := validateExchange(region, holder, ttl, true); err != nil {
		return HoldNone, err
	}
	if err := ctx.Err(); err != nil {
		return HoldNone, err
	}
	now := m.clock()
	m.mu.Lock()
	defer m.mu.Unlock()
	hold := HoldTaken
	if l, ok := m.leases[region]; ok && now.Before(l.until) {
		if l.holder != holder {
			return HoldNone, nil
		}
		hold = HoldRenewed
	}
	m.leases[region] = memLease{holder: holder, until: now.Add(ttl)}
	return hold, nil
}

// ReleaseExchange is RedisStore.ReleaseExchange.
func (m *MemoryExchange) ReleaseExchange(ctx context.Context, region, holder string) error {
	if err := validateExchange(region, holder, 0, false); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if l, ok := m.leases[region]; ok && l.holder == holder {
		delete(m.leases, region)
	}
	return nil
}

// SaveExchangeState is RedisStore.SaveExchangeState. It keeps a copy of
// state.
func (m *MemoryExchange) SaveExchangeState(ctx context.Context, region, holder string, state []byte) error {
	if err := validateExchange(region, holder, 0, false); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := m.clock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.held(region, holder, now) {
		return fmt.Errorf("%w: region %q, holder %q", ErrNotHolder, region, holder)
	}
	m.states[region] = slices.Clone(state)
	return nil
}

// LoadExchangeState is RedisStore.LoadExchangeState; the result is a
// copy.
func (m *MemoryExchange) LoadExchangeState(ctx context.Context, region string) ([]byte, error) {
	if region == "" {
		return nil, fmt.Errorf("%w: empty region", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.states[region]), nil
}

// DeleteShares is RedisStore.DeleteShares: the keys' buckets fall back to
// Limit.InitialShare, and an entry left with neither bucket nor share is
// freed.
func (m *MemoryStore) DeleteShares(ctx context.Context, keys []string) error {
	if err := validateAll(keys, validateKey); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, k := range keys {
		s := m.shard(k)
		s.mu.Lock()
		if e, ok := s.keys[k]; ok {
			e.hasShare, e.share = false, 0
			if !e.hasBucket {
				delete(s.keys, k)
			}
		}
		s.mu.Unlock()
	}
	return nil
}
