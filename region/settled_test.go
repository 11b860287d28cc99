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
