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
	runConformance(t, redisHarness(client))
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
	runConformance(t, redisHarness(client))

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
// under its own key prefix.
func redisHarness(client redis.UniversalClient) func(t *testing.T) *harness {
	return func(t *testing.T) *harness {
		// A generous timeout: this suite checks semantics, not latency,
		// and a race-enabled binary on a small machine can be slow.
		s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 2 * time.Second, ShareTTL: confShareTTL})
		if err != nil {
			t.Fatal(err)
		}
		return &harness{
			store: s,
			now:   time.Now,
			// Real time must pass for Redis to refill; this is the interval
			// between polls of a condition, not a wait for an outcome.
			tick: func() { time.Sleep(time.Millisecond) },
			bucketTTL: func(t *testing.T, key string) (time.Duration, bool) {
				st, ok := readRedisState(t, client, s, key)
				if !ok || !st.hasShare {
					return redisPTTL(t, client, s.stateKey(key))
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
				st, _ := readRedisState(t, client, s, key)
				st.tokens, st.last, st.bucketExpire = tokens, last.UnixMicro(), 0
				if err := client.Set(t.Context(), s.stateKey(key), st.encode(), 0).Err(); err != nil {
					t.Fatalf("SET: %v", err)
				}
			},
			keyTTL: func(t *testing.T, key string) (time.Duration, bool) {
				return redisPTTL(t, client, s.stateKey(key))
			},
		}
	}
}

// readRedisState reads key's state key; ok is false when it is missing.
func readRedisState(t *testing.T, client redis.UniversalClient, s *RedisStore, key string) (redisState, bool) {
	t.Helper()
	name := s.stateKey(key)
	v, err := client.Get(t.Context(), name).Result()
	if errors.Is(err, redis.Nil) {
		return redisState{}, false
	}
	if err != nil {
		t.Fatalf("GET %s: %v", name, err)
	}
	exp, err := client.Do(t.Context(), "PEXPIRETIME", name).Int64()
	if err != nil {
		t.Fatalf("PEXPIRETIME %s: %v", name, err)
	}
	st, err := decodeRedisState(v, exp)
	if err != nil {
		t.Fatal(err)
	}
	return st, true
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
