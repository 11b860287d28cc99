package region_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ration-dev/ration/region"
)

// TestSettledKeysHoldStill: keys of a few requests an epoch in every region,
// far under their limit, with Poisson noise, write their shares far less
// often than keys that follow every move of their targets
// (Config.SettledPPM negative), while every region keeps at least the share
// its mean demand needs and the shares never sum above the quota.
func TestSettledKeysHoldStill(t *testing.T) {
	seed := testSeed(t)
	writes := func(band int64) (int, string) {
		rng := rand.New(rand.NewPCG(seed, 7))
		c := newCluster(t, rng, 3, func(cfg *region.Config) {
			cfg.Policy = func(string) region.KeyPolicy { return region.KeyPolicy{Rate: testRate, Burst: testBurst} }
			cfg.SettledPPM = band
		})
		n := 0
		c.trace = func(e string) {
			if strings.Contains(e, " writes ") {
				n++
			}
		}
		var keys []string
		mean := map[string][]float64{}
		for i := range 30 {
			key := fmt.Sprintf("user/%02d", i)
			keys = append(keys, key)
			// 2 to 40 requests an epoch in each region: 0.2% to 4% of L.
			mean[key] = []float64{2 + rng.Float64()*38, 2 + rng.Float64()*38, 2 + rng.Float64()*38}
		}
		poisson := func(m float64) int64 { // Knuth's, for small means
			k, p, l := int64(0), 1.0, math.Exp(-m)
			for p *= rng.Float64(); p > l; p *= rng.Float64() {
				k++
			}
			return k
		}
		c.check = func(c *cluster, when string) {
			for _, key := range keys {
				if sum := c.sum(key); sum > region.PPM {
					t.Fatalf("seed %d step %d after %s: Σ shares of %s = %d", seed, c.step, when, key, sum)
				}
			}
		}
		var short string
		for e := range 300 {
			c.run(keys, func(r int, key string) int64 { return poisson(mean[key][r]) })
			if e < 20 {
				continue
			}
			for _, key := range keys {
				for r := range c.nodes {
					if need := int64(mean[key][r] / testRate * region.PPM); c.applied(r, key) < need && short == "" {
						short = fmt.Sprintf("epoch %d: %s region %d holds %d ppm, its mean demand needs %d", e, key, r, c.applied(r, key), need)
					}
				}
			}
		}
		return n, short
	}
	settled, short := writes(0)
	if short != "" {
		t.Errorf("seed %d, settled keys: %s", seed, short)
	}
	following, _ := writes(-1)
	t.Logf("seed %d: 30 keys × 3 regions × 300 epochs: %d share writes settled, %d following every target", seed, settled, following)
	if settled*3 > following {
		t.Errorf("seed %d: %d share writes settled against %d following: want at most a third", seed, settled, following)
	}
}

// TestSettledBandIsBare replays, distilled, the failures of
// TestPropertyEscrowDeltas (seeds 1796169453764707234 and
// 1796169813480092165): a key whose demand fell a little came to rest
// within SettledPPM of targets that include the noise headroom, which for
// a region of hundreds of requests an epoch sit some 15,000 ppm from the
// max-min division of the demand itself, and so stayed more than 50,000
// ppm from the latter, the tests' and the simulator's convergence measure.
// The band is measured from the targets without the headroom.
func TestSettledBandIsBare(t *testing.T) {
	c := newCluster(t, rand.New(rand.NewPCG(1, 2)), 3, func(cfg *region.Config) {
		cfg.Policy = func(string) region.KeyPolicy { return region.KeyPolicy{Rate: testRate, Burst: testBurst} }
	})
	keys := []string{"k"}
	var demand []int64
	// 865 requests an epoch put region 2 at 919,913 ppm; at 800 its
	// target is 882,189 with the headroom, 866,666 without.
	for _, d := range [][]int64{{0, 0, 865}, {0, 0, 800}} {
		demand = d
		for range 30 {
			c.run(keys, func(r int, _ string) int64 { return demand[r] })
		}
	}
	need := make([]float64, len(demand))
	init := make([]int64, len(demand))
	for r := range demand {
		need[r] = float64(demand[r]) / testRate * region.PPM
		init[r] = c.nodes[r].st().Initial(c.regions[r])
	}
	want := region.Targets(region.PPM, need, c.nodes[0].st().Config().FloorPPM, init)
	for r := range want {
		if d := c.applied(r, "k") - want[r]; d > 50_000 || d < -50_000 {
			t.Errorf("region %d: got share %d, want %d ± 50000", r, c.applied(r, "k"), want[r])
		}
	}
}

// TestSettledRelativeKeys: keys without a rate (their rule left the policy,
// so their needs are each region's part of the demand) settle too. After
// steps of their demand among a few requests an epoch, as a small key's
// smoothed demand converges for tens of epochs, they write their shares
// far less often than keys that follow every move of their targets, and
// end within 50,000 ppm of the targets of the demand itself.
func TestSettledRelativeKeys(t *testing.T) {
	seed := testSeed(t)
	run := func(band int64) int {
		rng := rand.New(rand.NewPCG(seed, 9))
		c := newCluster(t, rng, 3, func(cfg *region.Config) { cfg.SettledPPM = band })
		n := 0
		c.trace = func(e string) {
			if strings.Contains(e, " writes ") {
				n++
			}
		}
		var keys []string
		demand := map[string][]int64{}
		for i := range 20 {
			keys = append(keys, fmt.Sprintf("gone/%02d", i))
		}
		c.check = func(c *cluster, when string) {
			for _, key := range keys {
				if sum := c.sum(key); sum > region.PPM {
					t.Fatalf("seed %d step %d after %s: Σ shares of %s = %d", seed, c.step, when, key, sum)
				}
			}
		}
		for step := range 4 {
			for _, key := range keys {
				demand[key] = []int64{1 + rng.Int64N(8), 1 + rng.Int64N(8), 1 + rng.Int64N(8)}
			}
			for range 60 {
				c.run(keys, func(r int, key string) int64 { return demand[key][r] })
			}
			for _, key := range keys {
				d := demand[key]
				need := make([]float64, len(d))
				for r := range d {
					need[r] = float64(d[r]) / float64(d[0]+d[1]+d[2]) * region.PPM
				}
				want := region.Targets(region.PPM, need, c.nodes[0].st().Config().FloorPPM, []int64{333_334, 333_333, 333_333})
				for r := range want {
					if got := c.applied(r, key); got-want[r] > 50_000 || want[r]-got > 50_000 {
						t.Errorf("seed %d band %d step %d: %s region %d holds %d ppm, want %d ± 50000", seed, band, step, key, r, got, want[r])
					}
				}
			}
		}
		return n
	}
	settled, following := run(0), run(-1)
	t.Logf("seed %d: 20 keys × 3 regions × 240 epochs: %d share writes settled, %d following every target", seed, settled, following)
	if settled*2 > following {
		t.Errorf("seed %d: %d share writes settled against %d following: want at most half", seed, settled, following)
	}
}

// TestSparseKeysHoldStill: keys of 100 a minute with a minute's burst, each
// asked once in about 50 epochs in a random region (cmd/ration-scale's
// load), write their shares far less often than the same keys with a bucket
// of one period's rate: a request is noise that a region's part of a full
// bucket (33 tokens) absorbs, so it does not move the shares (the smoothing
// horizon, region/epoch.go). The shares never sum above the quota, and no
// region is left without the share its bucket needs for one request.
func TestSparseKeysHoldStill(t *testing.T) {
	seed := testSeed(t)
	const rate = 100.0 / 60
	writes := func(burst float64) int {
		rng := rand.New(rand.NewPCG(seed, 11))
		c := newCluster(t, rng, 3, func(cfg *region.Config) {
			cfg.Policy = func(string) region.KeyPolicy { return region.KeyPolicy{Rate: rate, Burst: burst, Cost: 1} }
		})
		c.rate, c.burst = rate, burst
		n := 0
		c.trace = func(e string) {
			if strings.Contains(e, " writes ") {
				n++
			}
		}
		keys := make([]string, 200)
		for i := range keys {
			keys[i] = fmt.Sprintf("user/%03d", i)
		}
		c.check = func(c *cluster, when string) {
			for _, key := range keys {
				if sum := c.sum(key); sum > region.PPM {
					t.Fatalf("seed %d step %d after %s: Σ shares of %s = %d", seed, c.step, when, key, sum)
				}
			}
		}
		asked := map[string]int{}
		for range 300 {
			for _, key := range keys {
				asked[key] = -1
				if rng.IntN(50) == 0 {
					asked[key] = rng.IntN(3)
				}
			}
			c.run(keys, func(r int, key string) int64 {
				if asked[key] == r {
					return 1
				}
				return 0
			})
		}
		for _, key := range keys {
			for r := range c.nodes {
				if got := float64(c.applied(r, key)) / region.PPM * burst; burst > rate && got < 1 {
					t.Errorf("seed %d, burst %v: %s region %d holds %d ppm, %.2f tokens of a full bucket", seed, burst, key, r, c.applied(r, key), got)
				}
			}
		}
		return n
	}
	minute, second := writes(100), writes(rate)
	t.Logf("seed %d: 200 keys × 3 regions × 300 epochs, a request each in 50 epochs: %d share writes with a minute's burst, %d with a second's", seed, minute, second)
	if minute*10 > second {
		t.Errorf("seed %d: %d share writes with a minute's burst against %d with a second's: want at most a tenth", seed, minute, second)
	}
}

// TestNoisyDemandFollowedWithinTheBucket: a noisy demand under the key's
// rate that appears in one region (Poisson, 8 tokens an epoch at a rate of
// 10 and a minute's burst) is followed slowly (the smoothing horizon), but
// fast enough that the region's part of the bucket (200 tokens) covers
// what its share lags behind: its bucket never runs dry, and its share
// serves the demand before that part would have run out at the initial
// share (200 tokens at a deficit of 8 − 3.33 an epoch: 42 epochs).
func TestNoisyDemandFollowedWithinTheBucket(t *testing.T) {
	seed := testSeed(t)
	const rate, burst, mean = 10.0, 600.0, 8.0
	rng := rand.New(rand.NewPCG(seed, 13))
	c := newCluster(t, rng, 3, func(cfg *region.Config) {
		cfg.Policy = func(string) region.KeyPolicy { return region.KeyPolicy{Rate: rate, Burst: burst, Cost: 1} }
	})
	c.rate, c.burst = rate, burst
	keys := []string{"k"}
	checkSum(t, c, keys, nil)
	inner := c.check
	c.check = func(c *cluster, when string) {
		inner(c, when)
		c.checkTokens("k", when)
	}
	poisson := func(m float64) int64 {
		k, p, l := int64(0), 1.0, math.Exp(-m)
		for p *= rng.Float64(); p > l; p *= rng.Float64() {
			k++
		}
		return k
	}
	least, served := math.Inf(1), 0
	for e := 1; e <= 120; e++ {
		c.run(keys, func(r int, _ string) int64 {
			if r == 0 {
				return poisson(mean)
			}
			return 0
		})
		b := c.nodes[0].store.PeekAt(c.now, "k", c.limit(0))
		least = min(least, b.Tokens)
		if served == 0 && float64(b.SharePPM)/region.PPM*rate >= mean {
			served = e
		}
	}
	t.Logf("seed %d: region 0's bucket held at least %.1f tokens; its share served the mean demand from epoch %d: %v", seed, least, served, sharesOf(c, "k"))
	if least < 1 {
		t.Errorf("seed %d: region 0's bucket ran dry (%.2f tokens)", seed, least)
	}
	if served == 0 || served > 42 {
		t.Errorf("seed %d: region 0's share served its mean demand from epoch %d (0: never in 120), want within 42", seed, served)
	}
}
