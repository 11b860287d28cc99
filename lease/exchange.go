package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file holds what the cross-region exchange (sync/exchange) keeps in a
// region's store besides the applied shares: the exchange lease, which
// elects the one replica of a region that moves its shares, and the
// region's persisted exchange state (DESIGN.md, "Replicas of one region").
// MemoryExchange (exchange_memory.go) is the same contract for one process.

// ExchangeHold is what AcquireExchange did.
type ExchangeHold int

const (
	// HoldNone: another replica holds the lease.
	HoldNone ExchangeHold = iota
	// HoldTaken: the lease was free (never taken, lapsed or released) and
	// the caller took it. A caller that believed it held the lease learns
	// that it had lapsed: another replica may have run the exchange since.
	HoldTaken
	// HoldRenewed: the caller held the lease and renewed it.
	HoldRenewed
)

// ErrNotHolder reports a write of the exchange state by a replica that does
// not hold the region's exchange lease (it lost it, or never had it).
// Nothing was written.
var ErrNotHolder = errors.New("lease: exchange lease not held")

// validateExchange checks the arguments every exchange call shares.
func validateExchange(region, holder string, ttl time.Duration, needTTL bool) error {
	switch {
	case region == "":
		return fmt.Errorf("%w: empty region", ErrInvalid)
	case holder == "":
		return fmt.Errorf("%w: empty holder", ErrInvalid)
	case needTTL && ttl < time.Millisecond:
		return fmt.Errorf("%w: exchange lease ttl %v is below 1ms", ErrInvalid, ttl)
	}
	return nil
}

// exchangeKey is "<prefix>exchange:{<region>}:<what>": the lease and the
// state of one region share a hash tag, so one script may touch both on a
// Redis Cluster.
func (s *RedisStore) exchangeKey(region, what string) string {
	return s.cfg.Prefix + "exchange:{" + keyEscaper.Replace(region) + "}:" + what
}

// acquireScript takes the lease when it is free (1) and renews it when
// holder already has it (2). KEYS[1] lease; ARGV[1] holder, ARGV[2] ttl in
// ms.
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

// saveScript writes the state only while holder holds the lease.
// KEYS[1] lease, KEYS[2] state; ARGV[1] holder, ARGV[2] state.
var saveScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
`)

// releaseScript deletes the lease if holder holds it. KEYS[1] lease;
// ARGV[1] holder.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// AcquireExchange takes region's exchange lease for holder for ttl, or
// renews it when holder holds it already (SET NX PX, in one script), and
// says which; holder holds the lease unless it returns HoldNone. The lease is timed by the
// server's clock from when the script runs, which is after the caller sent
// it: a caller that counts its lease from before the call never believes it
// longer than Redis does. Bounded by RedisConfig.Timeout.
func (s *RedisStore) AcquireExchange(ctx context.Context, region, holder string, ttl time.Duration) (ExchangeHold, error) {
	if err := validateExchange(region, holder, ttl, true); err != nil {
		return HoldNone, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	n, err := acquireScript.Run(ctx, s.client, []string{s.exchangeKey(region, "lease")}, holder, ttl.Milliseconds()).Int()
	if err != nil {
		return HoldNone, s.fail("exchange lease", err)
	}
	return ExchangeHold(n), nil
}

// ReleaseExchange gives region's exchange lease up if holder holds it, so
// that another replica takes over at once instead of after the ttl.
func (s *RedisStore) ReleaseExchange(ctx context.Context, region, holder string) error {
	if err := validateExchange(region, holder, 0, false); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if err := releaseScript.Run(ctx, s.client, []string{s.exchangeKey(region, "lease")}, holder).Err(); err != nil {
		return s.fail("exchange release", err)
	}
	return nil
}

// SaveExchangeState stores state as region's exchange state, atomically
// with a check that holder holds the exchange lease; otherwise it returns
// ErrNotHolder and writes nothing. The state may be megabytes, so the call
// is bounded by ctx only, not by RedisConfig.Timeout.
func (s *RedisStore) SaveExchangeState(ctx context.Context, region, holder string, state []byte) error {
	if err := validateExchange(region, holder, 0, false); err != nil {
		return err
	}
	keys := []string{s.exchangeKey(region, "lease"), s.exchangeKey(region, "state")}
	n, err := saveScript.Run(ctx, s.client, keys, holder, state).Int()
	if err != nil {
		return s.fail("exchange save", err)
	}
	if n != 1 {
		return fmt.Errorf("%w: region %q, holder %q", ErrNotHolder, region, holder)
	}
	return nil
}

// LoadExchangeState returns region's stored exchange state, nil when none
// was ever saved. Bounded by ctx only, like SaveExchangeState.
func (s *RedisStore) LoadExchangeState(ctx context.Context, region string) ([]byte, error) {
	if region == "" {
		return nil, fmt.Errorf("%w: empty region", ErrInvalid)
	}
	b, err := s.client.Get(ctx, s.exchangeKey(region, "state")).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, s.fail("exchange load", err)
	}
	return b, nil
}

// DeleteShares removes the applied shares of keys: their buckets fall back
// to Limit.InitialShare (the exchange retires a key at rest this way, where
// the initial share is at most the applied one). Stored tokens above the
// lower capacity are clipped at the bucket's next use. An ErrUnavailable
// failure may leave some keys deleted; retrying is harmless.
func (s *RedisStore) DeleteShares(ctx context.Context, keys []string) error {
	if err := validateAll(keys, validateKey); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	pipe := s.client.Pipeline()
	for _, k := range keys {
		pipe.Del(ctx, s.shareKey(k))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return s.fail("delete shares", err)
	}
	return nil
}
