package lease

import (
	"context"
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
		s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 2 * time.Second})
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
				ms, err := client.Do(t.Context(), "PTTL", s.bucketKey(key)).Int64()
				if err != nil {
					t.Fatalf("PTTL: %v", err)
				}
				switch ms {
				case -2:
					return 0, false
				case -1:
					return -1, true
				}
				return time.Duration(ms) * time.Millisecond, true
			},
			setBucket: func(t *testing.T, key string, tokens float64, last time.Time) {
				err := client.HSet(t.Context(), s.bucketKey(key),
					"tokens", strconv.FormatFloat(tokens, 'g', -1, 64),
					"last", strconv.FormatInt(last.UnixMicro(), 10)).Err()
				if err != nil {
					t.Fatalf("HSET: %v", err)
				}
			},
		}
	}
}
