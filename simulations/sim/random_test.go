package sim

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

var (
	randomSeed = flag.Uint64("random.seed", 0, "seed of TestRandomScenariosStayWithinTheBound (0: random)")
	randomRuns = flag.Int("random.runs", 0, "scenarios TestRandomScenariosStayWithinTheBound generates (0: 6, 2 under -race)")
)

// TestRandomScenariosStayWithinTheBound is the bound as a property: random
// regions, keys, demand steps, networks and faults (partitions, with and
// without reclaim, Redis failovers, crashes, scale-ups, unreachable and
// restarted regionds, keys failing local or closed), run with escrow and static;
// no window may exceed the bound the simulator computes for the scenario.
// A failure prints the scenario, which replays as a file.
func TestRandomScenariosStayWithinTheBound(t *testing.T) {
	seed := testSeed(t, randomSeed, "random.seed")
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	runs := *randomRuns
	if runs == 0 {
		runs = 6
		if raceEnabled {
			runs = 2
		}
	}
	for i := range runs {
		doc := randomScenario(rng, i)
		sc, err := Parse(fmt.Sprintf("random-%d.yaml", i), []byte(doc))
		if err != nil {
			t.Fatalf("scenario %d does not parse: %v\n%s", i, err, doc)
		}
		for _, alg := range []Algorithm{Escrow, Static} {
			res, err := Run(sc, Options{Algorithm: alg})
			if err != nil {
				t.Fatalf("scenario %d, %s: %v\n%s", i, alg, err, doc)
			}
			if s := res.Summary; s.BoundRatioMax > 1 || s.WindowsOverBound > 0 {
				t.Errorf("scenario %d, %s: bound_ratio_max %v, %d windows over the bound; want ≤ 1, 0. The scenario:\n%s",
					i, alg, s.BoundRatioMax, s.WindowsOverBound, doc)
			}
		}
	}
}

// randomScenario writes a scenario of 40 s of simulated time.
func randomScenario(rng *rand.Rand, i int) string {
	const dur = 40 * time.Second
	regions := []string{"ap", "eu", "us", "sa"}[:2+rng.IntN(3)]
	var b strings.Builder
	fmt.Fprintf(&b, "name: random-%d\nseed: %d\nduration: %s\n", i, rng.Uint64(), dur)
	fmt.Fprintf(&b, "regions: [%s]\nagents_per_region: %d\n", strings.Join(regions, ", "), 2+rng.IntN(6))
	ttl := []int{50, 100, 100, 200, 300}[rng.IntN(5)]
	fmt.Fprintf(&b, "lease_ttl: %dms\nlease_period: %dms\n", ttl, ttl/2)
	fmt.Fprintf(&b, "sync_period: %s\n", []string{"500ms", "1s", "1s", "2s"}[rng.IntN(4)])
	skew := rng.IntN(120)
	fmt.Fprintf(&b, "network: { delay: %dms, jitter: %dms, loss: %.3f, clock_skew: %dms }\n",
		5+rng.IntN(150), rng.IntN(40), rng.Float64()*0.05, skew)
	b.WriteString("keys:\n")
	nkeys := 1 + rng.IntN(3)
	onErrors := []string{"local", "closed"}
	for k := range nkeys {
		limit := 200 + rng.IntN(20000)
		burst := limit * (1 + rng.IntN(3)) / 2
		burst = max(burst, 3)
		fmt.Fprintf(&b, "  - { name: k%d, limit: %d, burst: %d, cost: %d, on_error: %s", k, limit, burst, 1+rng.IntN(3), onErrors[rng.IntN(2)])
		if rng.IntN(3) == 0 {
			fmt.Fprintf(&b, ", partition_reclaim_after: %ds", 2+rng.IntN(8))
		}
		if rng.IntN(2) == 0 {
			fmt.Fprintf(&b, ", count: %d, zipf: 1.1", 2+rng.IntN(20))
		}
		b.WriteString(" }\n")
	}
	b.WriteString("demand:\n")
	at := time.Duration(0)
	for s := 0; s < 2+rng.IntN(4); s++ {
		var rates []string
		for _, r := range regions {
			rates = append(rates, fmt.Sprintf("%s: %d", r, rng.IntN(15000)))
		}
		ramp := ""
		if s > 0 && rng.IntN(3) == 0 {
			ramp = fmt.Sprintf(", ramp: %ds", 1+rng.IntN(5))
		}
		fmt.Fprintf(&b, "  - { at: %s%s, rates: { %s } }\n", at, ramp, strings.Join(rates, ", "))
		at += time.Duration(3+rng.IntN(12)) * time.Second
		if at >= dur-5*time.Second {
			break
		}
	}
	nf := rng.IntN(4)
	if nf > 0 {
		b.WriteString("faults:\n")
	}
	for range nf {
		r := regions[rng.IntN(len(regions))]
		fat := time.Duration(2+rng.IntN(30)) * time.Second
		switch rng.IntN(6) {
		case 0:
			fmt.Fprintf(&b, "  - { at: %s, partition: %s, for: %ds }\n", fat, r, 2+rng.IntN(15))
		case 1:
			fmt.Fprintf(&b, "  - { at: %s, redis_failover: %s, lost_writes: %dms }\n", fat, r, 100+rng.IntN(5000))
		case 2:
			fmt.Fprintf(&b, "  - { at: %s, crash_agents: %.2f, region: %s, for: %ds }\n", fat, 0.1+0.8*rng.Float64(), r, 1+rng.IntN(5))
		case 3:
			fmt.Fprintf(&b, "  - { at: %s, unreachable: %s, for: %ds }\n", fat, r, 1+rng.IntN(8))
		case 4:
			fmt.Fprintf(&b, "  - { at: %s, restart: %s, for: %dms }\n", fat, r, 200+rng.IntN(8000))
		default:
			fmt.Fprintf(&b, "  - { at: %s, add_agents: %d, region: %s }\n", fat, 1+rng.IntN(5), r)
		}
	}
	return b.String()
}
