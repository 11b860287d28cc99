package lease

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/region"
)

// benchLimit never runs dry, so every grant is whole and the benchmarks
// measure the allocator, not the quota.
var benchLimit = Limit{Rate: 1e12, Burst: 1e12, Cost: 1, InitialShare: region.PPM}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "tenant=" + strconv.Itoa(i) + "|route=/v1/transfers"
	}
	return keys
}

// BenchmarkGrant measures the memory store's grant path, one key per call,
// on one goroutine and on all of them (sharded locks).
func BenchmarkGrant(b *testing.B) {
	keys := benchKeys(1024)
	b.Run("memory", func(b *testing.B) {
		m := NewMemoryStore(MemoryConfig{})
		reqs := []GrantRequest{{Want: 1, Limit: benchLimit}}
		out := make([]Grant, 1)
		now := epoch
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			reqs[0].Key = keys[i%len(keys)]
			i++
			now = now.Add(time.Microsecond)
			m.GrantAt(now, reqs, out)
		}
		b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "grants/s")
	})
	b.Run("memory-parallel", func(b *testing.B) {
		m := NewMemoryStore(MemoryConfig{})
		var worker atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			reqs := []GrantRequest{{Want: 1, Limit: benchLimit}}
			out := make([]Grant, 1)
			// Workers walk the keys from different places, as independent
			// callers would, rather than in lockstep on one shard.
			i := int(worker.Add(1)) * 397
			for pb.Next() {
				reqs[0].Key = keys[i%len(keys)]
				i++
				m.GrantAt(epoch, reqs, out)
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grants/s")
	})
}

// leaseSize is how many tokens an agent leases per key per refresh in the
// ration sub-benchmarks: ρ̂ × T_lease for a key spending 1,000 tokens/s
// with the default 50ms lease period.
const leaseSize = 50

// BenchmarkRedisLease compares, on one real redis-server and from one
// goroutine, the two ways of spending a Redis quota:
//
//   - ration/layout=L/batch=N: one pipelined Grant call per op, leasing
//     leaseSize tokens for each of N keys (what regiond does for a batch
//     of agent refreshes); each granted token is then spent locally by an
//     agent. L is the store's RedisLayout: keys, or groups with 16 hashes
//     for the 1,000 keys (about 62 a hash, as a sized deployment's).
//   - ration/layout=L/hot: batch=1 on one key, a hot key's decision.
//   - baseline=evalsha-per-request: the classic limiter, one EVALSHA of
//     the same token-bucket script per request, taking 1 token.
//
// Each reports grants/s (script calls answered), tokens/s (requests that
// could be admitted) and roundtrips/token (network round trips to Redis
// per admitted request).
func BenchmarkRedisLease(b *testing.B) {
	client, err := NewRedisClient(redistest.Start(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = client.Close() })
	keys := benchKeys(1000)

	for _, cfg := range []RedisConfig{{Layout: LayoutKeys}, {Layout: LayoutGroups, Groups: 16}} {
		cfg.Prefix, cfg.Timeout = redistest.KeyPrefix(b)+cfg.Layout.String()+":", time.Second
		store, err := NewRedisStore(client, cfg)
		if err != nil {
			b.Fatal(err)
		}
		for _, batch := range []int{0, 1, 10, 100} {
			name := "ration/layout=" + cfg.Layout.String() + "/batch=" + strconv.Itoa(batch)
			if batch == 0 {
				name = "ration/layout=" + cfg.Layout.String() + "/hot"
			}
			b.Run(name, func(b *testing.B) {
				reqs := make([]GrantRequest, max(batch, 1))
				out := make([]Grant, len(reqs))
				var ops, grants, tokens int64
				next := 0
				for b.Loop() {
					for i := range reqs {
						reqs[i] = GrantRequest{Key: keys[next%len(keys)], Want: leaseSize, Limit: benchLimit}
						if batch > 0 {
							next++
						}
					}
					if err := store.Grant(context.Background(), reqs, out); err != nil {
						b.Fatal(err)
					}
					ops++
					for _, g := range out {
						grants++
						tokens += g.Granted
					}
				}
				reportLease(b, ops, grants, tokens)
			})
		}
	}

	b.Run("baseline=evalsha-per-request", func(b *testing.B) {
		ctx := context.Background()
		store, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(b), Timeout: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		if err := client.ScriptLoad(ctx, bucketScript).Err(); err != nil {
			b.Fatal(err)
		}
		names := make([][]string, len(keys))
		args := make([][]any, len(keys))
		for i, k := range keys {
			names[i] = store.keyNames(k)
			args[i] = scriptArgs(scriptItem{key: k, limit: benchLimit, op: opGrant, n: 1, shareTTL: store.Config().ShareTTL})
		}
		var ops, tokens int64
		for b.Loop() {
			i := ops % int64(len(keys))
			v, err := client.EvalSha(ctx, bucketScriptSHA, names[i], args[i]...).Result()
			if err != nil {
				b.Fatal(err)
			}
			rep, err := parseScriptReply(v)
			if err != nil {
				b.Fatal(err)
			}
			ops++
			tokens += rep.granted
		}
		reportLease(b, ops, ops, tokens)
	})
}

func reportLease(b *testing.B, roundtrips, grants, tokens int64) {
	sec := b.Elapsed().Seconds()
	if tokens == 0 || sec == 0 {
		b.Fatalf("no tokens granted in %d round trips", roundtrips)
	}
	b.ReportMetric(float64(grants)/sec, "grants/s")
	b.ReportMetric(float64(tokens)/sec, "tokens/s")
	b.ReportMetric(float64(roundtrips)/float64(tokens), "roundtrips/token")
}
