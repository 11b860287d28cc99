package lease

import (
	"flag"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/region"
)

var diffSeed = flag.Uint64("diff.seed", 0, "seed for TestRedisMatchesMemory (0: random)")

// TestRedisMatchesMemory checks that the Lua script and the Go code compute
// the same float64 values, bit for bit, from the same state. Redis refills
// by its own clock, so every bucket is first written with its last update
// in the future: both stores then clamp to it and refill nothing, and each
// grant, return and share change is pure arithmetic on known state. Expiry
// times are compared too: the key's (PEXPIRETIME) and, with a share, the
// bucket's own, kept in the key.
func TestRedisMatchesMemory(t *testing.T) {
	seed := *diffSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -diff.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 7))

	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	for _, layout := range []RedisLayout{LayoutKeys, LayoutGroups} {
		t.Run(layout.String(), func(t *testing.T) {
			// Four groups: the cases' keys share hashes.
			rs, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 2 * time.Second, Layout: layout, Groups: 4})
			if err != nil {
				t.Fatal(err)
			}
			matchMemory(t, rng, client, rs)
		})
	}
}

// matchMemory is TestRedisMatchesMemory on one Redis store.
func matchMemory(t *testing.T, rng *rand.Rand, client redis.UniversalClient, rs *RedisStore) {
	ms := NewMemoryStore(MemoryConfig{})
	// last is a day ahead of both clocks: Redis's real one, and the memory
	// store's, which is an hour before last.
	last := time.Now().Add(24 * time.Hour).Truncate(time.Microsecond)
	memNow := last.Add(-time.Hour)

	ctx := t.Context()
	for c := range 200 {
		key := "k" + strconv.Itoa(c)
		cost := []int64{1, 1, 2, 3, 7, 10}[rng.IntN(6)]
		l := Limit{
			Rate:         []float64{1e-9, 0.3, 7, 1000, 123456.789}[rng.IntN(5)],
			Burst:        float64(cost) + rng.Float64()*500,
			Cost:         cost,
			InitialShare: []int64{0, 1, 333_333, 777_777, region.PPM}[rng.IntN(5)],
		}
		if rng.IntN(3) == 0 {
			// A fixed window around last, where both stores' clocks are
			// clamped: of 1 s to a day, last anywhere in it.
			d := int64(1+rng.IntN(86_400)) * 1e6
			start := last.UnixMicro() - rng.Int64N(d)
			l.Window = [4]int64{start - d, start, start + d, start + 2*d}
		}
		tokens := rng.Float64() * l.Burst
		// Both stores start from the same bucket.
		start := redisState{tokens: tokens, last: last.UnixMicro()}
		writeRedisState(t, client, rs, key, start, 0)
		e := ms.shard(key).entry(key, memNow.UnixMicro())
		e.bucket, e.hasBucket = bucket{tokens: tokens, last: last.UnixMicro()}, true

		for step := range 8 {
			what := "grant"
			switch rng.IntN(4) {
			case 0:
				what = "return"
				r := []ReturnRequest{{Key: key, Tokens: 1 + rng.Int64N(50), Limit: l}}
				if err := rs.Return(ctx, r); err != nil {
					t.Fatal(err)
				}
				if err := ms.ReturnAt(memNow, r); err != nil {
					t.Fatal(err)
				}
			case 1:
				what = "share"
				u := []ShareUpdate{{Key: key, SharePPM: rng.Int64N(region.PPM + 1), Limit: l}}
				if !l.Fixed() && rng.IntN(3) == 0 { // shares set before it that the store has not applied
					u[0].Steps = randomSteps(rng)
				}
				if rng.IntN(2) == 0 { // tokens given with the share, sometimes again or of an older generation
					u[0].Gen, u[0].Received = uint64(1+rng.IntN(3)), rng.Int64N(400_000)
					if l.Fixed() && rng.IntN(4) > 0 {
						u[0].Window = l.Window[1+rng.IntN(2)] // this window, or the next (not credited)
					}
				}
				got, want := make([]ShareResult, 1), make([]ShareResult, 1)
				if err := rs.SetShares(ctx, u, got); err != nil {
					t.Fatal(err)
				}
				if err := ms.SetSharesAt(memNow, u, want); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want, got, cmp.Comparer(sameFloat)); diff != "" {
					t.Fatalf("case %d step %d %+v: Redis differs from memory (-memory +redis):\n%s", c, step, u[0], diff)
				}
				stored := make([]int64, 1)
				if err := rs.Shares(ctx, []string{key}, stored); err != nil || stored[0] != u[0].SharePPM {
					t.Fatalf("case %d step %d: Redis share %v (%v), want %d", c, step, stored, err, u[0].SharePPM)
				}
			default:
				r := []GrantRequest{{Key: key, Want: cost + rng.Int64N(100), Limit: l}}
				switch {
				case l.Fixed():
				case rng.IntN(3) == 0: // a share capped by the grant (GrantRequest.MaxShare)
					r[0].MaxShare = 1 + rng.Int64N(region.PPM)
				case rng.IntN(2) == 0: // a raise carried by the grant, with tokens now and then (both clocks are clamped: no refill)
					r[0].Raise = &ShareRaise{Steps: randomSteps(rng)}
					if rng.IntN(2) == 0 {
						r[0].Raise.Gen, r[0].Raise.Received = uint64(1+rng.IntN(3)), rng.Int64N(400_000)
					}
				}
				got, want := make([]Grant, 1), make([]Grant, 1)
				if err := rs.Grant(ctx, r, got); err != nil {
					t.Fatal(err)
				}
				ms.GrantAt(memNow, r, want)
				if diff := cmp.Diff(want, got, cmp.Comparer(sameFloat)); diff != "" {
					t.Fatalf("case %d step %d %+v: Redis differs from memory (-memory +redis):\n%s", c, step, r[0], diff)
				}
			}
			// The stored state and expiries agree after every step.
			st, redisExpire, ok := readRedisState(t, client, rs, key)
			if !ok {
				t.Fatalf("case %d step %d after %s: no state key", c, step, what)
			}
			memExpire, bucketExpire := e.expireAt, int64(0)
			if e.hasShare {
				memExpire, bucketExpire = e.shareExpireAt, e.expireAt
			}
			if !sameFloat(e.tokens, st.tokens) || e.last != st.last || e.win != st.win || memExpire != redisExpire || st.bucketExpire != bucketExpire ||
				st.hasShare != e.hasShare || st.share != int64(e.share) || st.gen != e.gen || st.credited != e.credited || st.window != e.escrow.window {
				t.Fatalf("case %d step %d after %s with %+v: memory %+v key expiry %d, redis %+v key expiry %d",
					c, step, what, l, *e, memExpire, st, redisExpire)
			}
		}
	}
}

// sameFloat is bitwise equality, with NaN equal to NaN.
func sameFloat(a, b float64) bool {
	return math.Float64bits(a) == math.Float64bits(b) || (a != a && b != b)
}

// randomSteps is 1 to 3 share steps, oldest first, within the last minute.
func randomSteps(rng *rand.Rand) []ShareStep {
	var steps []ShareStep
	age := time.Duration(rng.Int64N(int64(time.Minute)))
	for range 1 + rng.IntN(3) {
		age -= time.Duration(rng.Int64N(int64(age) + 1))
		steps = append(steps, ShareStep{SharePPM: 1 + rng.Int64N(region.PPM), Age: age})
	}
	return steps
}
