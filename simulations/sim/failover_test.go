package sim

import (
	"flag"
	"fmt"
	"testing"
)

var failoverSeed = flag.Uint64("failover.seed", 0, "seed of TestFailoverLosingAGift (0: random)")

// TestFailoverLosingAGift: eu gives its share to us, and a Redis failover
// 15 s later loses the writes of the last 14 s, the gift among them: eu's
// store holds its old share again. Nothing in the exchange's own view of
// the key changes (eu has no demand), so only the store's new incarnation
// makes eu write it again. Without that the stale share stayed until eu's
// demand came back 45 s later, when eu admitted on share it had given away,
// far over the bound (bound_ratio_max 1.7).
func TestFailoverLosingAGift(t *testing.T) {
	seed := testSeed(t, failoverSeed, "failover.seed")
	sc := parseDoc(t, "failover.yaml", fmt.Sprintf(`name: failover-losing-a-gift
seed: %d
duration: 100s
regions: [us, eu, ap]
agents_per_region: 5
network: { delay: 80ms, jitter: 20ms, loss: 0.01, clock_skew: 50ms }
keys:
  - { name: acme, limit: 6000, burst: 6000 }
demand:
  - { at: 0s, rates: { us: 600, eu: 9000, ap: 600 } }
  - { at: 30s, rates: { us: 9000, eu: 0, ap: 600 } }
  - { at: 90s, rates: { us: 9000, eu: 9000, ap: 9000 } }
faults:
  - { at: 45s, redis_failover: eu, lost_writes: 14s }
`, seed))
	res, err := Run(sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	eu := 0
	for i, r := range res.Regions {
		if r == "eu" {
			eu = i
		}
	}
	var restored, after int64 // eu's share just after the failover, and 2 s later
	for _, s := range res.Series {
		switch {
		case s.T > 45 && s.T <= 45.2:
			restored = max(restored, s.Share[eu])
		case s.T > 47 && s.T < 89:
			after = max(after, s.Share[eu])
		}
	}
	if restored < 500_000 {
		t.Fatalf("eu's share after the failover: %d ppm; the scenario needs the lost gift back (above 500,000)", restored)
	}
	if after > 50_000 {
		t.Errorf("eu's share from 2 s after the failover until its demand returns: up to %d ppm, want the gift written again (≤ 50,000)", after)
	}
	if s := res.Summary; s.BoundRatioMax > 1 || s.WindowsOverBound > 0 {
		t.Errorf("bound_ratio_max %v, %d windows over the bound; want ≤ 1, 0", s.BoundRatioMax, s.WindowsOverBound)
	}
}
