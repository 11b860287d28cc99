package lease

import (
	"strconv"
	"testing"
	"time"

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
	runConformance(t, func(t *testing.T) *harness {
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
	})
}
