package lease

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/bits"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
)

// TestRedisMemoryPerKey writes N keys (RATION_REDIS_MEM_KEYS, default
// 100,000; 10,000 with -short) to a redis-server of its own three ways,
// grants only, then a share write, then a share write carrying tokens
// (escrow), and reports INFO memory's used_memory per key: the growth from
// the empty database divided by N. Then everything ration keeps in Redis
// for an active global key, in one figure: the escrow's key and the key's
// record in the exchange's persisted state (issue 12 asks for about 150 B;
// the test logs how far it is and bounds it where it is). The same keys in
// the layout before issue 12 (a hash and a share key each, written by hand
// as the old script wrote them) are measured beside them as the baseline,
// then LayoutGroups (about 100 keys a hash, bounded; the default group
// count, far too many for N; too few, past the listpack limit), and two
// layouts that would meet issue 12's figure as what-ifs.
//
// Redis's own cost of a key with an expiry is most of the figure: on Redis
// 7.0 (jemalloc) a dictEntry in the keyspace and one in the expires dict
// (32 B each), a bucket pointer in each dict's table (8 B × table size / N,
// 21 B at N = 100,000), the key's string (32 B up to 30 characters, 48 B
// up to 44) and the value's object (a string of up to 12 bytes embedded in
// 32 B, up to 28 in 48 B, up to 44 in 64 B).
func TestRedisMemoryPerKey(t *testing.T) {
	n := redistest.MemoryKeys(t, "RATION_REDIS_MEM_KEYS")
	srv := redistest.StartServer(t) // its own: FLUSHALL and INFO need the server alone
	// Batches of 500 scripts on a loaded machine may take longer than the
	// client's default 500 ms read timeout.
	client, err := NewRedisClient(srv.URL() + "?read_timeout=10s&write_timeout=10s")
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
	// The grouped layout with groups of about 100 keys (a power of two
	// groups, each holding at most 100 keys on average), and with the
	// default group count (sized for ten million keys, so a hash holds
	// about one key at 100,000).
	sized := 1 << bits.Len(uint((n+99)/100-1))
	grouped, err := NewRedisStore(client, RedisConfig{Timeout: 10 * time.Second, Layout: LayoutGroups, Groups: sized})
	if err != nil {
		t.Fatal(err)
	}
	// An eighth of the sized groups: about 780 keys a hash, past the
	// fields up to which Redis keeps a hash compact (hash-max-listpack-
	// entries: 512 compiled in, as this server runs; 128 in the sample
	// redis.conf).
	if limit, err := client.ConfigGet(t.Context(), "hash-max-listpack-entries").Result(); err == nil {
		t.Logf("hash-max-listpack-entries %v", limit["hash-max-listpack-entries"])
	}
	crowded, err := NewRedisStore(client, RedisConfig{Timeout: 10 * time.Second, Layout: LayoutGroups, Groups: max(sized/8, 1)})
	if err != nil {
		t.Fatal(err)
	}
	sparse, err := NewRedisStore(client, RedisConfig{Timeout: 10 * time.Second, Layout: LayoutGroups})
	if err != nil {
		t.Fatal(err)
	}
	shareOn := func(s *RedisStore, gen uint64, received int64) func(ctx context.Context, ks []string) error {
		return func(ctx context.Context, ks []string) error {
			ups := make([]ShareUpdate, len(ks))
			for i, k := range ks {
				ups[i] = ShareUpdate{Key: k, SharePPM: 500_000, Limit: l, Gen: gen, Received: received}
			}
			return s.SetShares(ctx, ups, nil)
		}
	}
	grantOn := func(s *RedisStore) func(ctx context.Context, ks []string) error {
		return func(ctx context.Context, ks []string) error {
			reqs := make([]GrantRequest, len(ks))
			for i, k := range ks {
				reqs[i] = GrantRequest{Key: k, Want: 3, Limit: l}
			}
			return s.Grant(ctx, reqs, make([]Grant, len(ks)))
		}
	}
	share := func(gen uint64, received int64) func(ctx context.Context, ks []string) error {
		return shareOn(s, gen, received)
	}
	grant := grantOn(s)
	type writes = []func(context.Context, []string) error
	groupsName := fmt.Sprintf("groups=%d", sized)
	// The tables' share of the figure, for dicts of N entries: the rest
	// does not depend on N. A key is in two (the keyspace and the expires
	// dict); its exchange record in a third, the state hash's.
	tables := func(dicts int) float64 {
		return float64(dicts) * 8 * float64(uint64(1)<<bits.Len(uint(n-1))) / float64(n)
	}
	record := exchangeRecords(client, s)
	// Load the script and let the server make its lazily made structures
	// first: the first row would count them (17 B a key at 10,000 keys).
	measureRedisMemory(t, client, keys[:1], []func(context.Context, []string) error{grant, share(7, 12_345), record})
	if _, rec, err := encodeExchangeRecords(keys[:1]); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("an exchange record of a key named %q: %d B", keys[0], len(rec[0]))
	}
	for _, c := range []struct {
		name  string
		write []func(ctx context.Context, ks []string) error
		dicts int
		// bound is the figure less tables, what this layout reaches.
		bound float64
	}{
		{"grants", []func(context.Context, []string) error{grant}, 2, 129},
		{"grants+share", []func(context.Context, []string) error{grant, share(0, 0)}, 2, 145},
		{"grants+escrow", []func(context.Context, []string) error{grant, share(7, 12_345)}, 2, 161},
		// Everything ration keeps in Redis for an active key of a global
		// rule: the one figure issue 12 bounds (384 B less tables at
		// 100,000 keys, 393 B at 10,000, where the state hash may be
		// caught rehashing into a larger table, both tables held).
		{"all=grants+escrow+exchange-record", []func(context.Context, []string) error{grant, share(7, 12_345), record}, 3, 395},
		{"baseline=layout-before-issue-12/grants", []func(context.Context, []string) error{oldLayout(client, s, "")}, 2, 0},
		{"baseline=layout-before-issue-12/grants+share", []func(context.Context, []string) error{oldLayout(client, s, "500000")}, 2, 0},
		{"baseline=layout-before-issue-12/grants+escrow", []func(context.Context, []string) error{oldLayout(client, s, "500000:7:0:12345")}, 2, 0},
		// Layouts that would meet issue 12's figure, modelled with filler
		// values of the sizes they would hold (not written by the
		// script): the keys in hashes of about 100 keys each (field: the
		// key, value: the key's state with its own expiry, 39 B with an
		// escrow), listpack-encoded, alone and with a 40 B exchange
		// record in the same value (hash-max-listpack-value raised to 128).
		// LayoutGroups with about 100 keys a hash: the keyspace holds the
		// groups, not the keys, so no table grows with N (its share of
		// the figure is under 0.2 B). Measured 50.8, 62.4 and 75.6 B at
		// 100,000 keys (1,024 groups, 98 keys each; values of 18, 31 and
		// 45 bytes), and 310.1 B counting the exchange's record (10.5 B
		// of it its table).
		{groupsName + "/grants", writes{grantOn(grouped)}, 0, 52},
		{groupsName + "/grants+share", writes{grantOn(grouped), shareOn(grouped, 0, 0)}, 0, 64},
		{groupsName + "/grants+escrow", writes{grantOn(grouped), shareOn(grouped, 7, 12_345)}, 0, 77},
		{"all=" + groupsName + "/grants+escrow+exchange-record", writes{grantOn(grouped), shareOn(grouped, 7, 12_345), record}, 1, 305},
		// The default group count with far fewer keys than it is sized
		// for: most hashes hold one key, which then costs about as much
		// as a key of its own (logged, not bounded).
		{"groups=default/grants+escrow", writes{grantOn(sparse), shareOn(sparse, 7, 12_345)}, 0, 0},
		{"groups=too-few/grants+escrow", writes{grantOn(crowded), shareOn(crowded, 7, 12_345)}, 0, 0},
		{"what-if=hash-per-100-keys/escrow", []func(context.Context, []string) error{groupedLayout(client, n, 39)}, 0, 0},
		{"what-if=hash-per-100-keys/escrow+40B-record", []func(context.Context, []string) error{groupedLayout(client, n, 79)}, 0, 0},
	} {
		perKey := measureRedisMemory(t, client, keys, c.write)
		t.Logf("%-46s %6.1f B per key (%d keys; %.1f B of it the dicts' tables)", c.name, perKey, n, tables(c.dicts))
		if want := c.bound + tables(c.dicts) + 2; c.bound > 0 && perKey > want {
			t.Errorf("%s: %.1f B per key, want ≤ %.1f", c.name, perKey, want)
		}
		if strings.HasPrefix(c.name, "all=") {
			// Issue 12 asks for about 150 B (≤ 157.5 B, 5% over) counting
			// everything. Not met on Redis 7.0 with a Redis key per key
			// (about 149 B of Redis's own) and the exchange's records in
			// a hash (about 234 B a key): logged, not failed, and the
			// bound above keeps the figure from growing meanwhile. The
			// what-if rows below show the layout that would meet it.
			t.Logf("issue 12's about 150 B a key counting everything (≤ 157.5 B): %.1f B, %.2f× it", perKey, perKey/150)
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

// usedMemory is redistest.UsedMemory of client's server.
func usedMemory(t *testing.T, client redis.UniversalClient) int64 {
	t.Helper()
	return redistest.UsedMemory(t, client.Info(t.Context(), "memory").Result)
}

// exchangeRecords writes each key's record of the exchange's persisted
// state as sync/exchange.RedisCoordinator saves it: a field of the region's
// state hash, "<prefix>exchange:{<region>}:state", whose value is the
// key's field of the Snapshot message (encodeExchangeRecords).
func exchangeRecords(client redis.UniversalClient, s *RedisStore) func(ctx context.Context, ks []string) error {
	state := s.cfg.Prefix + "exchange:{eu}:state"
	return func(ctx context.Context, ks []string) error {
		head, records, err := encodeExchangeRecords(ks)
		if err != nil {
			return err
		}
		args := []any{"", head}
		for i, k := range ks {
			args = append(args, k, records[i])
		}
		return client.HSet(ctx, state, args...).Err()
	}
}

// encodeExchangeRecords is the head and records (codec.EncodeSnapshotParts)
// of a region whose keys ks each hold a steady key's state among three
// regions, as BenchmarkEpochAtScale's keys do after 60 epochs: a
// generation, the base, one gift made, received and acknowledged, and the
// smoothed demands.
func encodeExchangeRecords(ks []string) (head []byte, records [][]byte, err error) {
	snap := region.Snapshot{Region: "eu", Regions: []string{"ap", "eu", "us"}, Epoch: 1_700_000_060, Heard: make([]uint64, 3), HeardAt: make([]time.Time, 3)}
	z := func() []int64 { return make([]int64, 3) }
	for i, k := range ks {
		snap.Keys = append(snap.Keys, region.KeySnapshot{
			Key: k, Generation: 1_700_000_001, Base: 333_333,
			Row: []int64{0, 0, 1420 + int64(i)}, Taken: z(), In: []int64{0, 0, 226_933}, InTaken: z(),
			Refund: z(), Unclaim: z(), Ack: []int64{0, 0, 1420 + int64(i)}, AckTaken: z(), Settled: make([]uint64, 3),
			Tokens: z(), TokensIn: z(), TokensInWindow: z(), Demand: []float64{118.99999999999999, 159, 1.9967431728041785},
		})
	}
	return codec.EncodeSnapshotParts(&snap)
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

// groupedLayout writes keys as fields of about n/100 hashes (by the key's
// FNV-1a hash), each value size bytes of filler, and gives every hash an
// expiry, as a layout of several keys per Redis key would (hashes of up to
// 128 fields of up to hash-max-listpack-value bytes are listpacks). It
// raises hash-max-listpack-value to 128 for values above the default 64.
func groupedLayout(client redis.UniversalClient, n, size int) func(ctx context.Context, ks []string) error {
	val := strings.Repeat("x", size)
	groups := uint32(max(n/100, 1))
	return func(ctx context.Context, ks []string) error {
		if err := client.ConfigSet(ctx, "hash-max-listpack-value", strconv.Itoa(max(64, size))).Err(); err != nil {
			return err
		}
		pipe := client.Pipeline()
		for _, k := range ks {
			h := fnv.New32a()
			_, _ = h.Write([]byte(k))
			g := "ration:{g" + strconv.FormatUint(uint64(h.Sum32()%groups), 10) + "}"
			pipe.HSet(ctx, g, k, val)
			pipe.PExpire(ctx, g, 2*time.Minute)
		}
		_, err := pipe.Exec(ctx)
		return err
	}
}
