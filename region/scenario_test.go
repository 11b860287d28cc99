package region_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// Scenario tests: scripted deployments over virtual epochs, without random
// faults, each checking Σ of applied shares after every store write.

func rated(cfg *region.Config) {
	cfg.IdleAfter = 6 * time.Second
	cfg.Grace = 3 * time.Second
	cfg.Policy = func(key string) region.KeyPolicy {
		p := region.KeyPolicy{Rate: testRate}
		if key == "reclaim/k" {
			p.ReclaimAfter = reclaimAfter
		}
		return p
	}
}

// checkSum makes c fail the test when Σ of the applied shares of key goes
// above PPM + allowance().
func checkSum(t *testing.T, c *cluster, keys []string, allowance func(key string) int64) {
	c.check = func(c *cluster, when string) {
		for _, key := range keys {
			limit := int64(region.PPM)
			if allowance != nil {
				limit += allowance(key)
			}
			if sum := c.sum(key); sum > limit {
				t.Fatalf("step %d after %s: Σ shares of %s = %d, want ≤ %d", c.step, when, key, sum, limit)
			}
		}
	}
}

// targetsOf returns the max-min targets of a key's demand vector.
func targetsOf(c *cluster, demand []int64) []int64 {
	need := make([]float64, len(demand))
	init := make([]int64, len(demand))
	for r := range demand {
		need[r] = float64(demand[r]) / testRate * region.PPM
		init[r] = c.nodes[r].st().Initial(c.regions[r])
	}
	return region.Targets(region.PPM, need, c.nodes[0].st().Config().FloorPPM, init)
}

// converged reports whether every region's applied share of key is within
// 50,000 ppm of want.
func converged(c *cluster, key string, want []int64) bool {
	for r := range want {
		if d := c.applied(r, key) - want[r]; d > 50_000 || d < -50_000 {
			return false
		}
	}
	return true
}

func sharesOf(c *cluster, key string) []int64 {
	var out []int64
	for r := range c.nodes {
		out = append(out, c.applied(r, key))
	}
	return out
}

// TestScenarioDemandShift measures how many epochs shares take to reach
// the targets (±5% of PPM) after demand moves, from a converged state, for
// demands up to L per region. A change is tallied at the end of its epoch
// and acted on in the same epoch's second phase; the gifts are applied as
// they arrive, within the period; with α = 0.9 the smoothed demand is 1% of
// the change off in the epoch after. Three epochs at most (one or two
// measured).
func TestScenarioDemandShift(t *testing.T) {
	seed := testSeed(t)
	for _, n := range []int{3, 7} {
		rng := rand.New(rand.NewPCG(seed, uint64(n)))
		counts := map[int]int{}
		worst := 0
		for trial := 0; trial < 50; trial++ {
			c := newCluster(t, rng, n, rated)
			checkSum(t, c, []string{"k"}, nil)
			demand := make([]int64, n)
			pick := func() {
				for r := range demand {
					demand[r] = int64(rng.IntN(int(testRate)))
				}
			}
			pick()
			for e := 0; e < 10; e++ {
				c.run([]string{"k"}, func(r int, _ string) int64 { return demand[r] })
			}
			pick()
			want := targetsOf(c, demand)
			took := 0
			for e := 1; e <= 10 && took == 0; e++ {
				c.run([]string{"k"}, func(r int, _ string) int64 { return demand[r] })
				if converged(c, "k", want) {
					took = e
				}
			}
			if took == 0 {
				t.Fatalf("seed %d, %d regions: shares %v did not reach targets %v in 10 epochs", seed, n, sharesOf(c, "k"), want)
			}
			counts[took]++
			worst = max(worst, took)
		}
		t.Logf("%d regions: epochs to within 5%% of the targets after a change of demand, over 50 changes: %v", n, counts)
		if worst > 3 {
			t.Errorf("%d regions: converged in %d epochs, want ≤ 3", n, worst)
		}
	}
}

// TestScenarioPartitionFailStatic checks that a region that hears nobody
// keeps its share, that the others cannot take it, and that all converge
// once the partition heals.
func TestScenarioPartitionFailStatic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := newCluster(t, rng, 3, rated)
	keys := []string{"p/k"}
	checkSum(t, c, keys, nil)
	demand := []int64{500, 100, 300}
	run := func(epochs int) {
		for e := 0; e < epochs; e++ {
			c.run(keys, func(r int, _ string) int64 { return demand[r] })
		}
	}
	run(8)
	c.nodes[2].isolated = 20
	demand = []int64{900, 100, 0} // r2's demand goes, r0 wants it all
	// For StaleAfter r2 does not know it is cut off and may still give
	// (its gifts wait for the others); then it holds its share.
	run(4)
	held := c.applied(2, "p/k")
	for e := 4; e < 19; e++ {
		run(1)
		if got := c.applied(2, "p/k"); got != held {
			t.Fatalf("epoch %d of the partition: r2's share %d, want %d (fail-static)", e, got, held)
		}
	}
	if sum := c.applied(0, "p/k") + c.applied(1, "p/k"); sum > region.PPM-held {
		t.Fatalf("r0 and r1 hold %d during the partition, want ≤ %d (r2's share is not theirs)", sum, region.PPM-held)
	}
	run(2) // heals
	want := targetsOf(c, demand)
	for e := 1; ; e++ {
		run(1)
		if converged(c, "p/k", want) {
			break
		}
		if e == 6 {
			t.Fatalf("after the partition: shares %v, want %v ± 50000", sharesOf(c, "p/k"), want)
		}
	}
}

// TestScenarioReclaim checks partition_reclaim_after: after ReclaimAfter
// without hearing r2, r0 and r1 take its share above the floor, the
// overshoot stays within what they took, and it ends when r2 hears of it.
func TestScenarioReclaim(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	c := newCluster(t, rng, 3, rated)
	keys := []string{"reclaim/k"}
	checkSum(t, c, keys, func(key string) int64 { return reclaimAllowance(c, key) })
	demand := []int64{300, 300, 300}
	run := func() { c.run(keys, func(r int, _ string) int64 { return demand[r] }) }
	for e := 0; e < 8; e++ {
		run()
	}
	s2 := c.applied(2, "reclaim/k")
	floor := c.nodes[0].st().Config().FloorPPM
	c.nodes[2].isolated = 12
	demand = []int64{900, 900, 300}
	for e := 0; e < 11; e++ {
		run()
	}
	var took int64
	for _, i := range []int{0, 1} {
		took += c.nodes[i].st().Reclaims("reclaim/k")
	}
	if took == 0 || took > s2-floor {
		t.Fatalf("r0 and r1 reclaimed %d from r2's share %d, want in (0, %d]", took, s2, s2-floor)
	}
	// r2 hears nobody either, and reclaims from both of them: the
	// overshoot of a two-sided partition is both sides' reclaims.
	if sum := c.sum("reclaim/k"); sum <= region.PPM {
		t.Errorf("Σ during the partition %d, want above PPM: r2 still spends what was reclaimed", sum)
	}
	t.Logf("r2 held %d; r0 and r1 reclaimed %d (bound %d), r2 reclaimed %d; Σ during the partition %d",
		s2, took, s2-floor, c.nodes[2].st().Reclaims("reclaim/k"), c.sum("reclaim/k"))
	// Heal: r2 hears of the reclaim and lowers; the overshoot ends.
	for e := 1; ; e++ {
		run()
		if c.nodes[2].isolated == 0 && c.sum("reclaim/k") <= region.PPM {
			break
		}
		if e == 6 {
			t.Fatalf("after the partition: Σ %d, want ≤ PPM", c.sum("reclaim/k"))
		}
	}
	checkSum(t, c, keys, nil)
	for e := 0; e < 6; e++ {
		run()
	}
}

// TestScenarioJoin adds a region: the others restart with it in Regions and
// an explicit Initial that gives it 0; it starts at share 0 and receives
// gifts. Σ stays ≤ PPM throughout, including while configs differ.
func TestScenarioJoin(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	c := newCluster(t, rng, 3, rated)
	c.allowUnknown = true
	keys := []string{"j/k"}
	checkSum(t, c, keys, nil)
	old := []string{"r0", "r1"}
	for i := 0; i < 2; i++ {
		c.reconfigure(i, func(cfg *region.Config) { cfg.Regions = old })
	}
	c.nodes[2].down, c.nodes[2].unborn = true, true
	demand := []int64{700, 300, 0}
	run := func(epochs int) {
		for e := 0; e < epochs; e++ {
			c.run(keys, func(r int, _ string) int64 { return demand[r] })
		}
	}
	run(6)
	// Rolling change: r1 first, then r0, then r2 starts.
	joined := map[string]int64{"r0": 500_000, "r1": 500_000}
	for _, i := range []int{1, 0} {
		c.reconfigure(i, func(cfg *region.Config) { cfg.Regions = c.regions; cfg.Initial = joined })
		run(2)
	}
	c.nodes[2].cfg.Initial = joined
	c.restart(c.nodes[2])
	c.nodes[2].down, c.nodes[2].unborn = false, false
	if got := c.applied(2, "j/k"); got != 0 {
		t.Fatalf("joining region's share: got %d, want 0", got)
	}
	demand = []int64{300, 300, 400}
	run(8)
	want := targetsOf(c, demand)
	if !converged(c, "j/k", want) {
		t.Fatalf("after the join: shares %v, want %v ± 50000", sharesOf(c, "j/k"), want)
	}
}

// TestScenarioLeave removes a region: it stops, the others restart without
// it; their shares do not change at the restore, and the leaver's share is
// never handed out (Σ with its last share stays ≤ PPM).
func TestScenarioLeave(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	c := newCluster(t, rng, 3, rated)
	c.allowUnknown = true
	keys := []string{"l/k"}
	checkSum(t, c, keys, nil) // c.sum counts the stopped region's last share too
	demand := []int64{300, 300, 300}
	run := func(epochs int) {
		for e := 0; e < epochs; e++ {
			c.run(keys, func(r int, _ string) int64 { return demand[r] })
		}
	}
	run(8)
	c.nodes[2].down = true
	run(1)
	stay := map[string]int64{"r0": c.nodes[0].st().Initial("r0"), "r1": c.nodes[1].st().Initial("r1")}
	for i := 0; i < 2; i++ {
		before := c.nodes[i].st().Share("l/k")
		c.reconfigure(i, func(cfg *region.Config) { cfg.Regions = []string{"r0", "r1"}; cfg.Initial = stay })
		if got := c.nodes[i].st().Share("l/k"); got != before {
			t.Fatalf("%s's share after the restore without r2: got %d, want %d (unchanged)", c.regions[i], got, before)
		}
	}
	demand = []int64{1000, 100, 0}
	run(10)
	if a, b := c.applied(0, "l/k"), c.applied(1, "l/k"); a <= b {
		t.Errorf("after the leave, demand moved to r0: shares r0 %d, r1 %d, want r0 above r1", a, b)
	}
}

// TestScenarioIdleKeysRetire checks that keys nobody uses are retired
// everywhere (memory follows active keys, the stores fall back to the
// initial shares), and that they come back cleanly.
func TestScenarioIdleKeysRetire(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	c := newCluster(t, rng, 3, rated)
	var keys []string
	for i := 0; i < 20; i++ {
		keys = append(keys, fmt.Sprintf("i/%d", i))
	}
	checkSum(t, c, keys, nil)
	busy := true
	demand := func(r int, key string) int64 {
		if !busy {
			return 0
		}
		return int64(100 * (r + 1) * (len(key) % 3))
	}
	for e := 0; e < 10; e++ {
		c.run(keys, demand)
	}
	busy = false
	for e := 1; ; e++ {
		c.run(keys, demand)
		held := 0
		for _, nd := range c.nodes {
			held += nd.st().Keys()
		}
		if held == 0 {
			t.Logf("all keys forgotten %d epochs after the last demand", e)
			break
		}
		if e == 60 {
			t.Fatalf("60 epochs after the last demand: regions still hold %d keys, want 0", held)
		}
	}
	for i, nd := range c.nodes {
		got := make([]int64, len(keys))
		if err := nd.store.Shares(ctx, keys, got); err != nil {
			t.Fatal(err)
		}
		for k, v := range got {
			if v != -1 {
				t.Errorf("%s's store holds the share %d of %s after retirement, want none", c.regions[i], v, keys[k])
			}
		}
	}
	busy = true
	for e := 0; e < 8; e++ {
		c.run(keys, demand)
	}
	for _, key := range keys[:3] {
		if sum := c.sum(key); sum < region.PPM-50_000 {
			t.Errorf("%s after coming back: Σ shares %d, want about PPM", key, sum)
		}
	}
}

// TestScenarioSlowQuotaFollowsDemand moves all demand of a quota of 2
// tokens a second (120 a minute) from region to region, at 10 requests an
// epoch: the region it left saw no request where noise would have shown
// several, so its demand is gone at once, and the shares reach the targets
// within 2 epochs of each move (a long tail of smoothed demand, whose
// noise headroom is most of such a quota, took a hundred epochs). The
// buckets' tokens move with the share: the fleet never holds more than
// one ideal bucket (checkTokens after every write).
func TestScenarioSlowQuotaFollowsDemand(t *testing.T) {
	const rate, burst = 2.0, 120.0
	rng := rand.New(rand.NewPCG(testSeed(t), 1))
	c := newCluster(t, rng, 3, func(cfg *region.Config) {
		cfg.Policy = func(string) region.KeyPolicy { return region.KeyPolicy{Rate: rate, Burst: burst, Cost: 1} }
	})
	c.rate, c.burst = rate, burst
	checkSum(t, c, []string{"k"}, nil)
	inner := c.check
	c.check = func(c *cluster, when string) {
		inner(c, when)
		c.checkTokens("k", when)
	}
	floor := c.nodes[0].st().Config().FloorPPM
	for move, busy := range []int{0, 1, 2, 0} {
		demand := func(r int, _ string) int64 {
			if r == busy {
				return 10
			}
			return 0
		}
		took := 0
		for e := 1; e <= 20; e++ {
			c.run([]string{"k"}, demand)
			sh := sharesOf(c, "k")
			ok := sh[busy] >= region.PPM-2*floor-50_000
			for r := range sh {
				ok = ok && (r == busy || sh[r] <= floor+50_000)
			}
			if ok && took == 0 {
				took = e
			}
		}
		t.Logf("move %d (demand in r%d): within 5%% of the targets after %d epochs: %v", move, busy, took, sharesOf(c, "k"))
		if took == 0 || (move > 0 && took > 2) {
			t.Errorf("move %d: shares %v reached the targets after %d epochs (0: never in 20), want ≤ 2", move, sharesOf(c, "k"), took)
		}
	}
}
