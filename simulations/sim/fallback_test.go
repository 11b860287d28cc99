package sim

import (
	"flag"
	"fmt"
	"testing"
)

var fallbackSeed = flag.Uint64("fallback.seed", 0, "seed of TestUnreachableRegiond (0: random)")

// outageScenario cuts eu's agents off from their regiond for 20 s under
// demand far above L everywhere, for a key that fails onError.
func outageScenario(t *testing.T, seed uint64, onError string) *Scenario {
	t.Helper()
	return parseDoc(t, "outage.yaml", fmt.Sprintf(`name: outage
seed: %d
duration: 45s
regions: [us, eu, ap]
agents_per_region: 5
network: { delay: 80ms, jitter: 20ms, loss: 0.02, clock_skew: 50ms }
keys:
  - { name: acme, limit: 6000, burst: 6000, on_error: %s }
demand:
  - { at: 0s, rates: { us: 5000, eu: 5000, ap: 5000 } }
faults:
  - { at: 10s, unreachable: eu, for: 20s }
  - { at: 20s, add_agents: 2, region: eu }
`, seed, onError))
}

func TestUnreachableRegiond(t *testing.T) {
	seed := testSeed(t, fallbackSeed, "fallback.seed")
	run := func(onError string, alg Algorithm) *Result {
		res, err := Run(outageScenario(t, seed, onError), Options{Algorithm: alg})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for _, alg := range []Algorithm{Escrow, Static} {
		local, closed := run("local", alg), run("closed", alg)
		s := local.Summary
		t.Logf("%s, local: bound_ratio_max %.3f, excess over ideal 10 s %v%%, FALLBACK_LOCAL allowed %d",
			alg, s.BoundRatioMax, *s.ExcessOverIdealPct.S10, s.Paths["FALLBACK_LOCAL_allowed"])
		if s.BoundRatioMax > 1 || s.WindowsOverBound > 0 {
			t.Errorf("%s, local: bound_ratio_max %v, %d windows over the bound; want ≤ 1, 0", alg, s.BoundRatioMax, s.WindowsOverBound)
		}
		if s.Paths["FALLBACK_LOCAL_allowed"] == 0 {
			t.Errorf("%s, local: no decision by the emergency bucket", alg)
		}
		if alg == Escrow && *s.ExcessOverIdealPct.S10 <= 0 {
			t.Errorf("%s, local: excess over the ideal bucket at 10 s %v%%, want > 0 (the scenario must need the fallback term)", alg, *s.ExcessOverIdealPct.S10)
		}
		c := closed.Summary
		if c.BoundRatioMax > 1 || c.Paths["FAILED_CLOSED_denied"] == 0 || c.Paths["FALLBACK_LOCAL_allowed"] != 0 {
			t.Errorf("%s, closed: bound_ratio_max %v, paths %v; want ≤ 1 with FAILED_CLOSED denials and no local fallback", alg, c.BoundRatioMax, c.Paths)
		}
		if c.Admitted >= s.Admitted {
			t.Errorf("%s: closed admitted %d tokens, local %d: want fewer", alg, c.Admitted, s.Admitted)
		}
		// eu admits nothing of a closed key while cut off: its column in
		// the samples well inside the outage is zero.
		eu := 0
		for i, r := range closed.Regions {
			if r == "eu" {
				eu = i
			}
		}
		for _, smp := range closed.Series {
			if smp.T > 11 && smp.T < 29 && smp.Admitted[eu] > 0 {
				t.Errorf("%s, closed: eu admitted %v tokens/s at %vs, inside the outage", alg, smp.Admitted[eu], smp.T)
				break
			}
		}
	}
	open := run("open", Escrow).Summary
	if open.Paths["FAILED_OPEN_allowed"] == 0 || open.BoundRatioMax > 1 {
		t.Errorf("open: paths %v, bound_ratio_max %v; want FAILED_OPEN admissions, and windows in the outage not checked", open.Paths, open.BoundRatioMax)
	}
}
