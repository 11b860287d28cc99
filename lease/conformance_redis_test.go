package lease

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/redistest"
)

// TestRedisStoreConformance runs the suite on a real redis-server (or on
// RATION_REDIS_URL), each case under its own key prefix.
//
// Redis refills by its own clock (TIME), which the test cannot move: the
// time-dependent cases measure elapsed time instead (see
// conformance_time_test.go), and the backward-clock case writes a bucket
// whose last update lies in the server's future.
func TestRedisStoreConformance(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	runConformance(t, redisHarness(client, RedisConfig{}))
}

// TestRedisGroupsConformance runs the suite on LayoutGroups, with four
// groups so that the cases' keys share hashes (a real deployment's groups
// hold tens of keys).
func TestRedisGroupsConformance(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	runConformance(t, redisHarness(client, RedisConfig{Layout: LayoutGroups, Groups: 4}))
}

// TestRedisClusterConformance runs the suite on a three-node Redis Cluster
// started for it: the two names of a key must share a slot (the script
// touches both), and a batch's keys land on different nodes.
func TestRedisClusterConformance(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client, err := NewRedisClient(cluster.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	if _, ok := client.(*redis.ClusterClient); !ok {
		t.Fatalf("NewRedisClient(%q) is a %T, want a cluster client", cluster.Addrs(), client)
	}
	runConformance(t, redisHarness(client, RedisConfig{}))
	t.Run("Groups", func(t *testing.T) {
		runConformance(t, redisHarness(client, RedisConfig{Layout: LayoutGroups}))
	})
	// A key's names in both layouts share a slot, so a region on a
	// Cluster switches layouts as one on a single Redis does.
	t.Run("LayoutSwitch", func(t *testing.T) { testLayoutSwitch(t, client, clusterSlots) })

	t.Run("Incarnation", func(t *testing.T) {
		s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		inc, err := s.Incarnation(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if ids := strings.Split(inc, ","); len(ids) != 3 || slices.Contains(ids, "") {
			t.Errorf("Incarnation of a 3-master cluster: got %q, want three run_ids", inc)
		}
		if again, err := s.Incarnation(t.Context()); err != nil || again != inc {
			t.Errorf("Incarnation again: got %q, %v; want %q", again, err, inc)
		}
	})

	t.Run("BatchAcrossSlots", func(t *testing.T) {
		s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		reqs := make([]GrantRequest, 100)
		for i := range reqs {
			reqs[i] = GrantRequest{Key: "tenant-" + strconv.Itoa(i) + "-{x}", Want: 2, Limit: slow(10, 1)}
		}
		out := make([]Grant, len(reqs))
		if err := s.Grant(t.Context(), reqs, out); err != nil {
			t.Fatal(err)
		}
		for i, g := range out {
			if g.Err != nil || g.Granted != 2 {
				t.Errorf("item %d: got %+v, want 2 granted", i, g)
			}
		}
		// ForEachMaster calls fn on several goroutines at once.
		var nodes atomic.Int64
		err = client.(*redis.ClusterClient).ForEachMaster(t.Context(), func(ctx context.Context, c *redis.Client) error {
			n, err := c.DBSize(ctx).Result()
			if n > 0 {
				nodes.Add(1)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if nodes.Load() != 3 {
			t.Errorf("got keys on %d of 3 nodes, want the batch spread over all", nodes.Load())
		}
	})
}

// redisHarness makes a conformance harness per case on client, each case
// under its own key prefix, with cfg's layout and groups.
func redisHarness(client redis.UniversalClient, cfg RedisConfig) func(t *testing.T) *harness {
	return func(t *testing.T) *harness {
		// A generous timeout: this suite checks semantics, not latency,
		// and a race-enabled binary on a small machine can be slow.
		cfg.Prefix, cfg.Timeout, cfg.ShareTTL = redistest.KeyPrefix(t), 2*time.Second, confShareTTL
		s, err := NewRedisStore(client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		keyTTL := func(t *testing.T, key string) (time.Duration, bool) {
			if s.cfg.Layout == LayoutKeys {
				return redisPTTL(t, client, s.stateKey(key))
			}
			_, exp, ok := readRedisState(t, client, s, key)
			switch {
			case !ok:
				return 0, false
			case exp == 0:
				return -1, true
			}
			return time.Duration(exp-redisNow(t, client).UnixMilli()) * time.Millisecond, true
		}
		return &harness{
			store: s,
			now:   time.Now,
			// Real time must pass for Redis to refill; this is the interval
			// between polls of a condition, not a wait for an outcome.
			tick: func() { time.Sleep(time.Millisecond) },
			bucketTTL: func(t *testing.T, key string) (time.Duration, bool) {
				st, _, ok := readRedisState(t, client, s, key)
				if !ok || !st.hasShare {
					return keyTTL(t, key)
				}
				// A share keeps the key; the bucket's own expiry is in it.
				if st.bucketExpire == 0 {
					return -1, true
				}
				nowMS := redisNow(t, client).UnixMilli()
				if nowMS > st.bucketExpire {
					return 0, false
				}
				return time.Duration(st.bucketExpire-nowMS) * time.Millisecond, true
			},
			setBucket: func(t *testing.T, key string, tokens float64, last time.Time) {
				st, _, _ := readRedisState(t, client, s, key)
				st.tokens, st.last, st.bucketExpire = tokens, last.UnixMicro(), 0
				writeRedisState(t, client, s, key, st, 0)
			},
			keyTTL: keyTTL,
		}
	}
}

// readRedisState reads key's state in s's layout and its expiry (ms, 0
// never); ok is false when it is missing or, in a group, expired.
func readRedisState(t *testing.T, client redis.UniversalClient, s *RedisStore, key string) (st redisState, expireAtMS int64, ok bool) {
	t.Helper()
	if s.cfg.Layout == LayoutGroups {
		g := s.groupKey(key)
		v, err := client.HGet(t.Context(), g, groupField(key)).Result()
		if errors.Is(err, redis.Nil) {
			return redisState{}, 0, false
		}
		if err != nil {
			t.Fatalf("HGET %s: %v", g, err)
		}
		exp, st, err := decodeGroupValue(v)
		if err != nil {
			t.Fatal(err)
		}
		if expired(exp, redisNow(t, client).UnixMicro()) {
			return redisState{}, 0, false
		}
		return st, exp, true
	}
	name := s.stateKey(key)
	v, err := client.Get(t.Context(), name).Result()
	if errors.Is(err, redis.Nil) {
		return redisState{}, 0, false
	}
	if err != nil {
		t.Fatalf("GET %s: %v", name, err)
	}
	exp, err := client.Do(t.Context(), "PEXPIRETIME", name).Int64()
	if err != nil {
		t.Fatalf("PEXPIRETIME %s: %v", name, err)
	}
	st, err = decodeRedisState(v, exp)
	if err != nil {
		t.Fatal(err)
	}
	return st, max(exp, 0), true
}

// writeRedisState writes key's state (long form) in s's layout, expiring
// at expireAtMS (0 never), bypassing the script; a group is given the
// expiry the script would give it.
func writeRedisState(t *testing.T, client redis.UniversalClient, s *RedisStore, key string, st redisState, expireAtMS int64) {
	t.Helper()
	ctx := t.Context()
	if s.cfg.Layout == LayoutKeys {
		name := s.stateKey(key)
		if err := client.Set(ctx, name, st.encode(), 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", name, err)
		}
		if expireAtMS != 0 {
			if err := client.PExpireAt(ctx, name, time.UnixMilli(expireAtMS)).Err(); err != nil {
				t.Fatalf("PEXPIREAT %s: %v", name, err)
			}
		}
		return
	}
	g := s.groupKey(key)
	if err := client.HSet(ctx, g, groupField(key), groupValue(expireAtMS, st.encode())).Err(); err != nil {
		t.Fatalf("HSET %s: %v", g, err)
	}
	var err error
	switch n, _ := client.HLen(ctx, g).Result(); {
	case expireAtMS == 0:
		err = client.Persist(ctx, g).Err()
	case n == 1: // a new group
		err = client.PExpireAt(ctx, g, time.UnixMilli(expireAtMS)).Err()
	default:
		err = client.Do(ctx, "PEXPIREAT", g, expireAtMS, "GT").Err()
	}
	if err != nil {
		t.Fatalf("expiry of %s: %v", g, err)
	}
}

// redisPTTL is a key's PTTL: exists is false when it is gone, ttl < 0
// when it never expires.
func redisPTTL(t *testing.T, client redis.UniversalClient, name string) (time.Duration, bool) {
	t.Helper()
	ms, err := client.PTTL(t.Context(), name).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", name, err)
	}
	switch ms {
	case -2:
		return 0, false
	case -1:
		return -1, true
	}
	return ms, true
}

// redisNow is the server's clock (TIME), which the script reads.
func redisNow(t *testing.T, client redis.UniversalClient) time.Time {
	t.Helper()
	now, err := client.Time(t.Context()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now
}
