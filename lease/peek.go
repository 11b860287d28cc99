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
	pipe := s.client.Pipeline()
	reads := s.readState(ctx, pipe, key, true)
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return BucketState{}, false, s.fail("peek", err)
	}
	t, err := now.Result()
	if err != nil {
		return BucketState{}, false, s.fail("peek", err)
	}
	e, err := reads.entry(t.UnixMilli())
	if err != nil {
		return BucketState{}, false, fmt.Errorf("lease: redis state of %q: %w", key, err)
	}
	st, ok := e.peek(t.UnixMicro(), l)
	return st, ok, nil
}

// stateReads are the reads of a key's state in every place the script
// looks (bucket.lua, the head), sent in a pipeline by readState.
type stateReads struct {
	layout    RedisLayout
	own       *redis.StringCmd   // the key's own Redis key
	ownExpiry *redis.DurationCmd // its PEXPIRETIME; nil: not read
	group     *redis.StringCmd   // its field in its group
	oldBucket *redis.SliceCmd    // the bucket before issue 12; nil: not read
	oldShare  *redis.StringCmd   // the share before issue 12
}

// readState queues the reads of key's state on pipe; withBucket reads what
// only the bucket needs (the own key's expiry, the old bucket) too.
func (s *RedisStore) readState(ctx context.Context, pipe redis.Pipeliner, key string, withBucket bool) stateReads {
	names := s.keyNames(key)
	own, group := names[0], names[1]
	if s.cfg.Layout == LayoutGroups {
		own, group = group, own
	}
	r := stateReads{layout: s.cfg.Layout, own: pipe.Get(ctx, own), group: pipe.HGet(ctx, group, groupField(key))}
	if withBucket {
		r.ownExpiry = pipe.PExpireTime(ctx, own)
		r.oldBucket = pipe.HMGet(ctx, names[2], "tokens", "last", "w")
	}
	r.oldShare = pipe.Get(ctx, names[3])
	return r
}

// entry reads the state into an entry as the script reads it at nowMS:
// this layout's place, then the other's (a group's field only until it
// expires), then the bucket of before issue 12; and, while the state holds
// no share (and, in LayoutGroups, was not in its group), the share of
// before.
func (r stateReads) entry(nowMS int64) (memEntry, error) {
	var e memEntry
	fromOwn := func() (bool, error) {
		v, err := r.own.Result()
		if errors.Is(err, redis.Nil) {
			return false, nil
		} else if err != nil {
			return false, err
		}
		var expMS int64
		if r.ownExpiry != nil {
			exp, err := r.ownExpiry.Result()
			if err != nil {
				return false, err
			}
			expMS = exp.Milliseconds()
		}
		if len(v) == shortStateLen && expMS <= 0 {
			if r.ownExpiry == nil {
				return true, nil // no share in it; the bucket was not asked for
			}
			return false, fmt.Errorf("a short state without an expiry")
		}
		st, err := decodeRedisState(v, expMS)
		if err != nil {
			return false, err
		}
		e.setState(st)
		return true, nil
	}
	fromGroup := func() (bool, error) {
		v, err := r.group.Result()
		if errors.Is(err, redis.Nil) {
			return false, nil
		} else if err != nil {
			return false, err
		}
		expMS, st, err := decodeGroupValue(v)
		if err != nil {
			return false, err
		}
		if expired(expMS, nowMS*1000) {
			return false, nil
		}
		e.setState(st)
		return true, nil
	}
	first, second := fromOwn, fromGroup
	if r.layout == LayoutGroups {
		first, second = fromGroup, fromOwn
	}
	found, err := first()
	if err != nil {
		return e, err
	}
	inGroup := found && r.layout == LayoutGroups
	if !found {
		if found, err = second(); err != nil {
			return e, err
		}
	}
	if !found && r.oldBucket != nil {
		h, err := r.oldBucket.Result()
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
	}
	if e.hasShare || inGroup {
		return e, nil
	}
	sv, err := r.oldShare.Result()
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

// setState is a state read from Redis as an entry.
func (e *memEntry) setState(st redisState) {
	e.bucket = bucket{tokens: st.tokens, last: st.last, win: st.win}
	e.hasBucket = true
	if st.hasShare {
		// Only a share keeps the key past its bucket's expiry.
		e.hasShare, e.share, e.expireAt = true, int32(st.share), st.bucketExpire
		e.escrow = escrow{gen: st.gen, window: st.window, credited: st.credited}
	}
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
