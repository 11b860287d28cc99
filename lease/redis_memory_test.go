package lease

import (
	"context"
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
)

// TestRedisMemoryPerKey writes N keys (RATION_REDIS_MEM_KEYS, default
// 100,000; 10,000 with -short) to a redis-server of its own three ways,
// grants only, then a share write, then a share write carrying tokens
// (escrow), and reports INFO memory's used_memory per key: the growth from
// the empty database divided by N. The same keys in the layout before
// issue 12 (a hash and a share key each, written by hand as the old script
// wrote them) are measured beside them as the baseline.
//
// Redis's own cost of a key with an expiry is most of the figure: on Redis
// 7.0 (jemalloc) a dictEntry in the keyspace and one in the expires dict
// (32 B each), a bucket pointer in each dict's table (8 B × table size / N,
// 21 B at N = 100,000), the key's string (32 B up to 30 characters, 48 B
// up to 44) and the value's object (a string of up to 12 bytes embedded in
// 32 B, up to 28 in 48 B, up to 44 in 64 B).
func TestRedisMemoryPerKey(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	if v := os.Getenv("RATION_REDIS_MEM_KEYS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1000 {
			t.Fatalf("RATION_REDIS_MEM_KEYS=%q: want an integer ≥ 1000", v)
		}
	}
	srv := redistest.StartServer(t) // its own: FLUSHALL and INFO need the server alone
	client, err := NewRedisClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	s, err := NewRedisStore(client, RedisConfig{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = policy.StoreKey("per-user", fmt.Sprintf("user=%07d", i))
	}
	// 60 a minute per user: the bucket expires 2 minutes after its last
	// grant, well after the test.
	l := Limit{Rate: 1, Burst: 60, Cost: 1, InitialShare: region.PPM}
	share := func(gen uint64, received int64) func(ctx context.Context, ks []string) error {
		return func(ctx context.Context, ks []string) error {
			ups := make([]ShareUpdate, len(ks))
			for i, k := range ks {
				ups[i] = ShareUpdate{Key: k, SharePPM: 500_000, Limit: l, Gen: gen, Received: received}
			}
			return s.SetShares(ctx, ups, nil)
		}
	}
	grant := func(ctx context.Context, ks []string) error {
		reqs := make([]GrantRequest, len(ks))
		for i, k := range ks {
			reqs[i] = GrantRequest{Key: k, Want: 3, Limit: l}
		}
		return s.Grant(ctx, reqs, make([]Grant, len(ks)))
	}
	// The tables' share of the figure: the rest does not depend on N.
	tables := 2 * 8 * float64(uint64(1)<<bits.Len(uint(n-1))) / float64(n)
	for _, c := range []struct {
		name  string
		write []func(ctx context.Context, ks []string) error
		// bound is the figure less tables, what this layout reaches.
		bound float64
	}{
		{"grants", []func(context.Context, []string) error{grant}, 129},
		{"grants+share", []func(context.Context, []string) error{grant, share(0, 0)}, 145},
		{"grants+escrow", []func(context.Context, []string) error{grant, share(7, 12_345)}, 161},
		{"baseline=layout-before-issue-12/grants", []func(context.Context, []string) error{oldLayout(client, s, "")}, 0},
		{"baseline=layout-before-issue-12/grants+share", []func(context.Context, []string) error{oldLayout(client, s, "500000")}, 0},
		{"baseline=layout-before-issue-12/grants+escrow", []func(context.Context, []string) error{oldLayout(client, s, "500000:7:0:12345")}, 0},
	} {
		perKey := measureRedisMemory(t, client, keys, c.write)
		t.Logf("%-46s %6.1f B per key (%d keys; %.1f B of it the dicts' tables)", c.name, perKey, n, tables)
		if c.bound > 0 && perKey > c.bound+tables+2 {
			t.Errorf("%s: %.1f B per key, want ≤ %.1f", c.name, perKey, c.bound+tables+2)
		}
	}
}

// measureRedisMemory empties the server, writes keys with each of write in
// turn (in batches of 500) and returns the growth of used_memory (less the
// clients' buffers) per key.
func measureRedisMemory(t *testing.T, client redis.UniversalClient, keys []string, write []func(ctx context.Context, ks []string) error) float64 {
	t.Helper()
	ctx := t.Context()
	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := usedMemory(t, client)
	for _, w := range write {
		for i := 0; i < len(keys); i += 500 {
			if err := w(ctx, keys[i:min(i+500, len(keys))]); err != nil {
				t.Fatal(err)
			}
		}
	}
	return float64(usedMemory(t, client)-before) / float64(len(keys))
}

// usedMemory is INFO memory's used_memory less mem_clients_normal: the
// buffers of the connection that wrote the keys are not the keys' cost.
func usedMemory(t *testing.T, client redis.UniversalClient) int64 {
	t.Helper()
	info, err := client.Info(t.Context(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	field := func(name string) int64 {
		for line := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, name+":"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		t.Fatalf("no %s in INFO memory:\n%s", name, info)
		return 0
	}
	return field("used_memory") - field("mem_clients_normal")
}

// oldLayout writes keys as the script before issue 12 did after a grant:
// the bucket hash with its expiry and, unless share is "", the share key.
func oldLayout(client redis.UniversalClient, s *RedisStore, share string) func(ctx context.Context, ks []string) error {
	return func(ctx context.Context, ks []string) error {
		pipe := client.Pipeline()
		for _, k := range ks {
			pipe.HSet(ctx, s.oldBucketKey(k), "tokens", "56.999993999999997", "last", strconv.FormatInt(time.Now().UnixMicro(), 10))
			pipe.PExpire(ctx, s.oldBucketKey(k), 2*time.Minute)
			if share != "" {
				pipe.Set(ctx, s.oldShareKey(k), share, 0)
			}
		}
		_, err := pipe.Exec(ctx)
		return err
	}
}
