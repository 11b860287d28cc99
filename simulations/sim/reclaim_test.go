package sim

import (
	"flag"
	"fmt"
	"testing"

	"github.com/ration-dev/ration/region"
)

var reclaimSeed = flag.Uint64("reclaim.seed", 0, "seed of TestReclaimStaysWithinTheBound (0: random)")

// reclaimScenario is a partition of ap for 20 s under demand far above L
// everywhere: with reclaim, both sides of the partition run on more than
// the whole quota, so windows in it exceed the bound without the reclaim
// term and must stay within it with the term.
func reclaimScenario(t *testing.T, seed uint64, reclaimAfter string) *Scenario {
	t.Helper()
	return parseDoc(t, "reclaim.yaml", fmt.Sprintf(`name: reclaim
seed: %d
duration: 50s
regions: [us, eu, ap]
agents_per_region: 5
network: { delay: 80ms, jitter: 20ms, loss: 0.02, clock_skew: 50ms }
keys:
  - { name: acme, limit: 6000, burst: 6000, partition_reclaim_after: %s }
demand:
  - { at: 0s, rates: { us: 9000, eu: 3000, ap: 1000 } }
  - { at: 15s, rates: { us: 9000, eu: 9000, ap: 9000 } }
faults:
  - { at: 10s, partition: ap, for: 20s }
`, seed, reclaimAfter))
}

func TestReclaimStaysWithinTheBound(t *testing.T) {
	seed := testSeed(t, reclaimSeed, "reclaim.seed")

	with, err := Run(reclaimScenario(t, seed, "3s"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	without, err := Run(reclaimScenario(t, seed, "0s"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	maxSum := func(res *Result) int64 {
		var worst int64
		for _, s := range res.Series {
			var sum int64
			for _, x := range s.Share {
				sum += x
			}
			worst = max(worst, sum)
		}
		return worst
	}
	if got := maxSum(without); got > region.PPM {
		t.Errorf("fail-static: shares summed to %d ppm, want ≤ %d", got, region.PPM)
	}
	if got := maxSum(with); got <= region.PPM*5/4 {
		t.Errorf("with reclaim: shares summed to at most %d ppm, want the reclaims to take them well above %d", got, region.PPM)
	}
	if with.Summary.Admitted <= without.Summary.Admitted {
		t.Errorf("with reclaim admitted %d tokens, without %d: want more", with.Summary.Admitted, without.Summary.Admitted)
	}
	t.Logf("with reclaim: bound_ratio_max %.3f, admitted %d tokens; fail-static: %.3f, %d tokens",
		with.Summary.BoundRatioMax, with.Summary.Admitted, without.Summary.BoundRatioMax, without.Summary.Admitted)
	if got := with.Summary.BoundRatioMax; got > 1 || with.Summary.WindowsOverBound > 0 {
		t.Errorf("with reclaim: bound_ratio_max %v, %d windows over the bound; want ≤ 1, 0", got, with.Summary.WindowsOverBound)
	}
	if got := with.Summary.ExcessOverIdealPct.S10; got == nil || *got <= 0 {
		t.Errorf("with reclaim: excess over the ideal bucket at 10 s %v, want > 0%% (the scenario must need the reclaim term)", got)
	}
}
