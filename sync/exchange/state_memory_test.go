package exchange

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
)

// TestRedisStateMemoryPerKey saves the persisted exchange state of a region
// holding N keys (RATION_STATE_MEM_KEYS, default 100,000; 10,000 with
// -short), each a steady key's state among three regions (steadySnapshot),
// through RedisCoordinator to a redis-server of its own, and reports INFO
// memory's used_memory growth per key, the time of a whole save, of an
// incremental one of 1% of the keys (the best of two and of five; and the
// script's mean time in Redis), and of the load that joins it again. The layout before issue 12 (one hash of
// every record, each 128 B; written by that release's script, kept here)
// is measured beside it as the baseline. Issue 12 asks for about 150 B a
// key counting everything ration keeps in Redis; the buckets take about 70
// B of it, so the state is bounded at 70 B.
func TestRedisStateMemoryPerKey(t *testing.T) {
	n := redistest.MemoryKeys(t, "RATION_STATE_MEM_KEYS")
	srv := redistest.StartServer(t) // its own: INFO needs the server alone
	// NewRedisClient's defaults: a whole save of 100,000 keys takes longer
	// than the 500ms read timeout they once had.
	client, err := lease.NewRedisClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	s, err := lease.NewRedisStore(client, lease.RedisConfig{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := NewRedisCoordinator(s)
	// A whole save is bounded by its context only (the exchange gives it
	// until the hold lapses).
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	for _, reg := range []string{"eu", "baseline"} {
		if _, err := c.Acquire(ctx, reg, "a", time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	snap := steadySnapshot(n)
	// 1% of the keys changed: their demands moved.
	part := snap
	part.Partial, part.Keys = true, nil
	for i := 0; i < n; i += 100 {
		k := snap.Keys[i]
		k.Demand = []float64{120, 158, 2.5}
		part.Keys = append(part.Keys, k)
	}
	encode := func(snap *region.Snapshot) SavedState {
		t.Helper()
		head, recs, err := codec.EncodeSnapshotParts(snap)
		if err != nil {
			t.Fatal(err)
		}
		st := SavedState{Whole: !snap.Partial, Head: head, Records: recs, Deleted: snap.Removed}
		for i := range snap.Keys {
			st.Keys = append(st.Keys, snap.Keys[i].Key)
		}
		return st
	}
	wholeSt, partSt := encode(&snap), encode(&part)
	oneSt := encode(&region.Snapshot{Region: "eu", Regions: snap.Regions, Heard: snap.Heard, HeardAt: snap.HeardAt, Keys: snap.Keys[:1]})
	// The baseline's records: as long as that release's (128 B).
	legacy := func(st SavedState) SavedState {
		st.Records = make([][]byte, len(st.Keys))
		for i := range st.Records {
			st.Records[i] = []byte(strings.Repeat("r", 128))
		}
		return st
	}
	type layout struct {
		name string
		save func(SavedState) error
	}
	for _, l := range []layout{
		{"baseline=one-hash", func(st SavedState) error { return oneHashSave(ctx, client, c, "baseline", legacy(st)) }},
		{"ration", func(st SavedState) error { return c.Save(ctx, "eu", "a", st) }},
	} {
		timed := func(st SavedState) time.Duration {
			t.Helper()
			start := time.Now()
			if err := l.save(st); err != nil {
				t.Fatalf("%s: %v", l.name, err)
			}
			return time.Since(start)
		}
		// A first save of one key loads the script and lets the server
		// make its lazily made structures, which would count.
		timed(oneSt)
		before := stateUsedMemory(t, client)
		whole := timed(wholeSt)
		perKey := float64(stateUsedMemory(t, client)-before) / float64(n)
		whole = min(whole, timed(wholeSt))
		incr := time.Duration(1 << 62)
		if err := client.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			incr = min(incr, timed(partSt))
		}
		// Redis's own time for them: the script blocks the server.
		stats, err := client.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		_, script, _ := strings.Cut(stats, "cmdstat_evalsha:")
		_, script, _ = strings.Cut(script, "usec_per_call=")
		script, _, _ = strings.Cut(script, ",")
		t.Logf("%-18s %6.1f B per key (%d keys); whole save %v, incremental save of 1%% %v (Redis's time %s µs)",
			l.name, perKey, n, whole.Round(time.Millisecond), incr.Round(time.Microsecond), script)
		if l.name != "ration" {
			continue
		}
		t.Logf("a record of key %q: %d B", snap.Keys[0].Key, len(oneSt.Records[0]))
		start := time.Now()
		st, err := c.Load(ctx, "eu")
		if err != nil {
			t.Fatal(err)
		}
		loaded := time.Since(start)
		got, err := codec.JoinSnapshot(st.Head, st.Keys, st.Records)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("load of %d keys %v, join %v", len(got.Keys), loaded.Round(time.Millisecond), (time.Since(start) - loaded).Round(time.Millisecond))
		if len(got.Keys) != n {
			t.Fatalf("loaded %d keys, want %d", len(got.Keys), n)
		}
		if perKey > 70 {
			t.Errorf("persisted state: %.1f B per key, want ≤ 70", perKey)
		}
	}
}

// oneHashScript is the save script of the release before issue 12's: the
// state one hash, the head at field "" and every record beside it.
var oneHashScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '1' then
  redis.call('DEL', KEYS[2])
elseif redis.call('TYPE', KEYS[2]).ok ~= 'hash' then
  return -1
end
local last = 4 + 2 * tonumber(ARGV[4])
local i = last + 1
while i <= #ARGV do
  local j = math.min(i + 999, #ARGV)
  redis.call('HDEL', KEYS[2], unpack(ARGV, i, j))
  i = j + 1
end
redis.call('HSET', KEYS[2], '', ARGV[3])
i = 5
while i <= last do
  local j = math.min(i + 1999, last)
  redis.call('HSET', KEYS[2], unpack(ARGV, i, j))
  i = j + 1
end
return 1
`)

// oneHashSave saves st as the release before issue 12's RedisCoordinator.Save did.
func oneHashSave(ctx context.Context, client redis.UniversalClient, c *RedisCoordinator, reg string, st SavedState) error {
	whole := "0"
	if st.Whole {
		whole = "1"
	}
	args := []any{"a", whole, st.Head, len(st.Keys)}
	for i, k := range st.Keys {
		args = append(args, k, st.Records[i])
	}
	for _, k := range st.Deleted {
		args = append(args, k)
	}
	n, err := oneHashScript.Run(ctx, client, []string{c.key(reg, "lease"), c.key(reg, "state")}, args...).Int()
	if err == nil && n != 1 {
		err = fmt.Errorf("saved: %d", n)
	}
	return err
}

// steadySnapshot is the whole snapshot of a region holding n keys named as
// lease's TestRedisMemoryPerKey names them, each a steady key's state among
// three regions as BenchmarkEpochAtScale's keys are after 60 epochs: a
// generation, the base, one gift made, received and acknowledged, and the
// smoothed demands.
func steadySnapshot(n int) region.Snapshot {
	snap := region.Snapshot{Region: "eu", Regions: []string{"ap", "eu", "us"}, Epoch: 1_700_000_060, Heard: make([]uint64, 3), HeardAt: make([]time.Time, 3)}
	z := func() []int64 { return make([]int64, 3) }
	for i := range n {
		snap.Keys = append(snap.Keys, region.KeySnapshot{
			Key: policy.StoreKey("per-user", fmt.Sprintf("user=%07d", i)), Generation: 1_700_000_001, Base: 333_333,
			Row: []int64{0, 0, 1420 + int64(i)}, Taken: z(), In: []int64{0, 0, 226_933}, InTaken: z(),
			Refund: z(), Unclaim: z(), Ack: []int64{0, 0, 1420 + int64(i)}, AckTaken: z(), Settled: make([]uint64, 3),
			Tokens: z(), TokensIn: z(), TokensInWindow: z(), Demand: []float64{118.99999999999999, 159, 1.9967431728041785},
		})
	}
	return snap
}

// stateUsedMemory is redistest.UsedMemory of client's server.
func stateUsedMemory(t *testing.T, client redis.UniversalClient) int64 {
	t.Helper()
	return redistest.UsedMemory(t, client.Info(context.Background(), "memory").Result)
}
