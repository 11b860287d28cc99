package exchange

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/region"
)

// This file holds what the exchange keeps in a region's store besides the
// applied shares: the holder election, which makes one replica of a region
// the one that runs its exchange, and the region's persisted exchange state
// (docs/DESIGN.md, "Replicas of one region"). RedisCoordinator keeps them in
// the region's Redis, MemoryCoordinator in one process.

// ErrInvalidArgument reports a Coordinator call with an empty region or
// holder, or a hold TTL below a millisecond. Nothing was done.
var ErrInvalidArgument = errors.New("exchange: invalid argument")

// checkHold checks the arguments every Coordinator call shares.
func checkHold(reg, holder string, ttl time.Duration, needTTL bool) error {
	switch {
	case reg == "":
		return fmt.Errorf("%w: empty region", ErrInvalidArgument)
	case holder == "":
		return fmt.Errorf("%w: empty holder", ErrInvalidArgument)
	case needTTL && ttl < time.Millisecond:
		return fmt.Errorf("%w: hold ttl %v is below 1ms", ErrInvalidArgument, ttl)
	}
	return nil
}

// RedisCoordinator is the holder election and persisted exchange state of a
// region whose replicas share a Redis (or Redis Cluster): the hold is a key
// set with NX PX, renewed each epoch, and the state is written only while
// the writer holds it, in one script. Safe for concurrent use.
type RedisCoordinator struct {
	client  redis.UniversalClient
	prefix  string
	timeout time.Duration
	// minGroups is the fewest groups the state is saved in: the store's
	// groups in its grouped layout (sized by the operator for the active
	// keys, -redis-groups), else 1.
	minGroups int

	mu     sync.Mutex
	groups map[string]int // reg → the group count stored, as last saved or loaded here
}

// NewRedisCoordinator returns the coordinator on the Redis of store, with
// its key prefix and call timeout. With the store's grouped layout the
// exchange's state is saved in at least as many groups as the store's keys
// (lease.RedisConfig.Groups, sized for the keys expected), so that a
// deployment growing to its size never regroups its state (redis_state.go).
func NewRedisCoordinator(store *lease.RedisStore) *RedisCoordinator {
	cfg := store.Config()
	c := &RedisCoordinator{client: store.Client(), prefix: cfg.Prefix, timeout: cfg.Timeout, minGroups: 1, groups: make(map[string]int)}
	if cfg.Layout == lease.LayoutGroups {
		c.minGroups = max(1, cfg.Groups)
	}
	return c
}

// holdEscaper keeps a region name from breaking the hash tag.
var holdEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// key is "<prefix>exchange:{<region>}:<what>": the hold and the state of one
// region share a hash tag, so one script may touch both on a Redis Cluster.
// The hold's key is named "lease", as it was before the election had its
// own name: replicas of two versions must agree on it during an upgrade.
func (c *RedisCoordinator) key(reg, what string) string {
	return c.prefix + "exchange:{" + holdEscaper.Replace(reg) + "}:" + what
}

// acquireScript takes the hold when it is free (1) and renews it when
// holder already has it (2). KEYS[1] hold; ARGV[1] holder, ARGV[2] ttl in ms.
var acquireScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 2
end
if v then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
`)

// releaseScript deletes the hold if holder has it. KEYS[1] hold; ARGV[1]
// holder.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// Acquire takes region reg's hold for holder for ttl, or renews it when
// holder has it already, and says which; holder holds the election unless
// it returns region.HoldNone. The hold is timed by the server's clock from
// when the script runs, after the caller sent it: a caller that counts its
// hold from before the call never believes it longer than Redis does.
// Bounded by the store's timeout.
func (c *RedisCoordinator) Acquire(ctx context.Context, reg, holder string, ttl time.Duration) (region.Hold, error) {
	if err := checkHold(reg, holder, ttl, true); err != nil {
		return region.HoldNone, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	n, err := acquireScript.Run(ctx, c.client, []string{c.key(reg, "lease")}, holder, ttl.Milliseconds()).Int()
	if err != nil {
		return region.HoldNone, fmt.Errorf("exchange: redis hold: %w", err)
	}
	return region.Hold(n), nil
}

// Release gives reg's hold up if holder has it, so that another replica
// takes over at once instead of after the ttl.
func (c *RedisCoordinator) Release(ctx context.Context, reg, holder string) error {
	if err := checkHold(reg, holder, 0, false); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if err := releaseScript.Run(ctx, c.client, []string{c.key(reg, "lease")}, holder).Err(); err != nil {
		return fmt.Errorf("exchange: redis release: %w", err)
	}
	return nil
}

// checkSave checks Save's arguments.
func checkSave(reg, holder string, st *SavedState) error {
	if err := checkHold(reg, holder, 0, false); err != nil {
		return err
	}
	if len(st.Records) != len(st.Keys) {
		return fmt.Errorf("%w: %d records for %d keys", ErrInvalidArgument, len(st.Records), len(st.Keys))
	}
	if slices.Contains(st.Keys, "") || slices.Contains(st.Deleted, "") {
		return fmt.Errorf("%w: a record of an empty key", ErrInvalidArgument)
	}
	return nil
}

// MemoryCoordinator is RedisCoordinator in memory, for the replicas of a
// region that share one process: the embedded default (one replica, which
// always holds the election) and tests. Safe for concurrent use; make one
// with NewMemoryCoordinator.
type MemoryCoordinator struct {
	clock func() time.Time

	mu     sync.Mutex
	holds  map[string]memHold
	states map[string]*memState
}

// memState is a region's state in a MemoryCoordinator.
type memState struct {
	head    []byte
	records map[string][]byte
}

type memHold struct {
	holder string
	until  time.Time
}

// NewMemoryCoordinator returns an empty MemoryCoordinator whose holds lapse
// by clock (default time.Now).
func NewMemoryCoordinator(clock func() time.Time) *MemoryCoordinator {
	if clock == nil {
		clock = time.Now
	}
	return &MemoryCoordinator{clock: clock, holds: make(map[string]memHold), states: make(map[string]*memState)}
}

// Acquire is RedisCoordinator.Acquire.
func (m *MemoryCoordinator) Acquire(ctx context.Context, reg, holder string, ttl time.Duration) (region.Hold, error) {
	if err := checkHold(reg, holder, ttl, true); err != nil {
		return region.HoldNone, err
	}
	if err := ctx.Err(); err != nil {
		return region.HoldNone, err
	}
	now := m.clock()
	m.mu.Lock()
	defer m.mu.Unlock()
	hold := region.HoldTaken
	if h, ok := m.holds[reg]; ok && now.Before(h.until) {
		if h.holder != holder {
			return region.HoldNone, nil
		}
		hold = region.HoldRenewed
	}
	m.holds[reg] = memHold{holder: holder, until: now.Add(ttl)}
	return hold, nil
}

// Release is RedisCoordinator.Release.
func (m *MemoryCoordinator) Release(ctx context.Context, reg, holder string) error {
	if err := checkHold(reg, holder, 0, false); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if h, ok := m.holds[reg]; ok && h.holder == holder {
		delete(m.holds, reg)
	}
	return nil
}

// Save is RedisCoordinator.Save. It keeps copies.
func (m *MemoryCoordinator) Save(ctx context.Context, reg, holder string, st SavedState) error {
	if err := checkSave(reg, holder, &st); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := m.clock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if h, ok := m.holds[reg]; !ok || h.holder != holder || !now.Before(h.until) {
		return fmt.Errorf("%w: region %q, holder %q", region.ErrNotHolder, reg, holder)
	}
	ms := m.states[reg]
	switch {
	case st.Whole:
		ms = &memState{records: make(map[string][]byte, len(st.Keys))}
		m.states[reg] = ms
	case ms == nil:
		return fmt.Errorf("%w: region %q", ErrNoWholeState, reg)
	}
	for _, k := range st.Deleted {
		delete(ms.records, k)
	}
	ms.head = slices.Clone(st.Head)
	for i, k := range st.Keys {
		ms.records[k] = slices.Clone(st.Records[i])
	}
	return nil
}

// Load is RedisCoordinator.Load; the result is a copy, its records in order of their keys.
func (m *MemoryCoordinator) Load(ctx context.Context, reg string) (SavedState, error) {
	st := SavedState{Whole: true}
	if reg == "" {
		return st, fmt.Errorf("%w: empty region", ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ms := m.states[reg]
	if ms == nil {
		return st, nil
	}
	st.Head = slices.Clone(ms.head)
	for _, k := range slices.Sorted(maps.Keys(ms.records)) {
		st.Keys = append(st.Keys, k)
		st.Records = append(st.Records, slices.Clone(ms.records[k]))
	}
	return st, nil
}
