package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Peek, for an operator (regiond's admin API): a key's bucket as the store
// holds it now, read without changing anything. The Redis store reads the
// key's state and the server's TIME and brings the bucket forward in Go
// with the arithmetic the script shares (bucket.go); the script itself is
// not involved.

// Peek returns key's bucket at the store's time for limit l, changing
// nothing. ok is false when the store holds no live bucket for the key
// (never leased, or expired): the state is then the bucket a grant would
// start (full, or empty for Limit.StartEmpty), at the applied share if the
// key holds one.
func (m *MemoryStore) Peek(ctx context.Context, key string, l Limit) (st BucketState, ok bool, err error) {
	if err := validateKey(key); err != nil {
		return BucketState{}, false, err
	}
	if err := ctx.Err(); err != nil {
		return BucketState{}, false, err
	}
	nowUS := m.clock().UnixMicro()
	s := m.shard(key)
	s.mu.Lock()
	var e memEntry
	if p, found := s.keys[key]; found {
		e = *p // a copy: peeking changes nothing
	}
	s.mu.Unlock()
	e.forget(nowUS)
	st, ok = e.peek(nowUS, l)
	return st, ok, nil
}

// peek brings a copy of an entry forward to nowUS under l.
func (e *memEntry) peek(nowUS int64, l Limit) (BucketState, bool) {
	live := e.live(nowUS)
	share := e.shareOr(l)
	rate, capacity := l.Regional(share)
	e.bringForward(nowUS, l, rate, capacity)
	return BucketState{Tokens: e.tokens, Rate: rate, Capacity: capacity, SharePPM: share, Gen: e.gen, Credited: e.credited}, live
}

// Peek is MemoryStore.Peek at the Redis server's time (TIME), in one round
// trip of reads.
func (s *RedisStore) Peek(ctx context.Context, key string, l Limit) (BucketState, bool, error) {
	if err := validateKey(key); err != nil {
		return BucketState{}, false, err
	}
	if err := l.validate(); err != nil {
		return BucketState{}, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	k := s.stateKey(key)
	pipe := s.client.Pipeline()
	state := pipe.Get(ctx, k)
	expire := pipe.PExpireTime(ctx, k)
	old := pipe.HMGet(ctx, s.oldBucketKey(key), "tokens", "last", "w")
	oldShare := pipe.Get(ctx, s.oldShareKey(key))
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return BucketState{}, false, s.fail("peek", err)
	}
	t, err := now.Result()
	if err != nil {
		return BucketState{}, false, s.fail("peek", err)
	}
	e, err := redisEntry(state, expire, old, oldShare)
	if err != nil {
		return BucketState{}, false, fmt.Errorf("lease: redis state of %q: %w", key, err)
	}
	st, ok := e.peek(t.UnixMicro(), l)
	return st, ok, nil
}

// redisEntry reads a key's Redis state into an entry as the script reads
// it (bucket.lua, the head): the state key; else the bucket hash of before
// issue 12; and, while the state key holds no share, the share key of
// before.
func redisEntry(state *redis.StringCmd, expire *redis.DurationCmd, old *redis.SliceCmd, oldShare *redis.StringCmd) (memEntry, error) {
	var e memEntry
	v, err := state.Result()
	switch {
	case err == nil:
		exp, err := expire.Result()
		if err != nil {
			return e, err
		}
		expMS := exp.Milliseconds()
		if len(v) == shortStateLen && expMS <= 0 {
			return e, fmt.Errorf("a short state without an expiry")
		}
		st, err := decodeRedisState(v, expMS)
		if err != nil {
			return e, err
		}
		e.bucket = bucket{tokens: st.tokens, last: st.last, win: st.win}
		e.hasBucket = true
		if st.hasShare {
			// Only a share keeps the key past its bucket's expiry.
			e.hasShare, e.share, e.expireAt = true, int32(st.share), st.bucketExpire
			e.escrow = escrow{gen: st.gen, window: st.window, credited: st.credited}
		}
	case errors.Is(err, redis.Nil):
		h, err := old.Result()
		if err != nil {
			return e, err
		}
		if tok, ok := h[0].(string); ok {
			if last, ok := h[1].(string); ok {
				if e.bucket, err = oldBucket(tok, last, h[2]); err != nil {
					return e, err
				}
				e.hasBucket = true
			}
		}
	default:
		return e, err
	}
	if e.hasShare {
		return e, nil
	}
	sv, err := oldShare.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return e, nil
	case err != nil:
		return e, err
	}
	parts := strings.Split(sv, ":") // share, or share:gen:window:credited
	var n [4]int64
	for i, p := range parts {
		if i >= len(n) {
			return e, fmt.Errorf("bad share %q", sv)
		}
		if n[i], err = strconv.ParseInt(p, 10, 64); err != nil || n[i] < 0 {
			return e, fmt.Errorf("bad share %q", sv)
		}
	}
	if (len(parts) != 1 && len(parts) != 4) || n[0] > 1_000_000 {
		return e, fmt.Errorf("bad share %q", sv)
	}
	e.hasShare, e.share = true, int32(n[0])
	e.escrow = escrow{gen: uint64(n[1]), window: n[2], credited: n[3]}
	return e, nil
}

// oldBucket parses the bucket hash of before issue 12.
func oldBucket(tokens, last string, w any) (bucket, error) {
	var b bucket
	var err error
	if b.tokens, err = strconv.ParseFloat(tokens, 64); err != nil {
		return b, fmt.Errorf("bad bucket tokens %q", tokens)
	}
	if b.last, err = strconv.ParseInt(last, 10, 64); err != nil {
		return b, fmt.Errorf("bad bucket last %q", last)
	}
	if ws, ok := w.(string); ok {
		if b.win, err = strconv.ParseInt(ws, 10, 64); err != nil {
			return b, fmt.Errorf("bad bucket window %q", ws)
		}
	}
	return b, nil
}
