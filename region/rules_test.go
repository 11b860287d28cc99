package region_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// TestScenarioDisagreementHolds runs three regions that agree on a rule,
// moves share toward the one with demand, then has one region define the
// rule otherwise: every region holds the key (its shares stay where they
// were, whatever demand does) and names the disagreement, until the
// definitions agree again, when the shares follow demand once more.
func TestScenarioDisagreementHolds(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	defs := make([]region.RuleDef, 3) // each region's definition of rule "r"
	for i := range defs {
		defs[i] = region.RuleDef{Name: "r", Fingerprint: 1, Limit: int64(testRate), Period: 1e9, Burst: int64(testBurst), Cost: 1}
	}
	c := newCluster(t, rng, 3, nil)
	for i := range c.nodes {
		c.reconfigure(i, func(cfg *region.Config) {
			rated(cfg)
			cfg.Policy = func(string) region.KeyPolicy { return region.KeyPolicy{Rule: "r", Rate: testRate} }
			cfg.Rules = func() (string, []region.RuleDef) {
				return "rev-" + string(rune('0'+defs[i].Fingerprint)), []region.RuleDef{defs[i]}
			}
		})
	}
	const key = "r/k"
	checkSum(t, c, []string{key}, nil)
	demand := []int64{int64(testRate), 0, 0}
	run := func(epochs int) {
		for e := 0; e < epochs; e++ {
			c.run([]string{key}, func(r int, _ string) int64 { return demand[r] / 2 })
		}
	}
	run(10)
	if want := targetsOf(c, []int64{int64(testRate) / 2, 0, 0}); !converged(c, key, want) {
		t.Fatalf("before the disagreement: shares %v, want about %v", sharesOf(c, key), want)
	}
	for i, nd := range c.nodes {
		if ds, _ := nd.st().Disagreements(); len(ds) != 0 {
			t.Fatalf("region %d disagrees while all agree: %+v", i, ds)
		}
	}

	defs[1].Fingerprint, defs[1].Limit = 2, 10*int64(testRate) // region 1 raises the limit alone
	run(2)
	held := sharesOf(c, key)
	demand = []int64{0, 0, int64(testRate)} // demand moves to region 2
	run(10)
	if got := sharesOf(c, key); !equal(got, held) {
		t.Fatalf("while regions disagree: shares moved from %v to %v", held, got)
	}
	for i, nd := range c.nodes {
		ds, _ := nd.st().Disagreements()
		if len(ds) != 1 || ds[0].Rule != "r" || len(ds[0].Theirs) == 0 {
			t.Fatalf("region %d: disagreements %+v, want rule r", i, ds)
		}
		for _, th := range ds[0].Theirs {
			if th.Def.Fingerprint == ds[0].Ours.Fingerprint {
				t.Errorf("region %d lists an agreeing definition: %+v", i, th)
			}
		}
	}

	defs[1] = defs[0] // agreed again
	run(10)
	if want := targetsOf(c, []int64{0, 0, int64(testRate) / 2}); !converged(c, key, want) {
		t.Fatalf("after agreeing again: shares %v, want about %v", sharesOf(c, key), want)
	}
	for i, nd := range c.nodes {
		if ds, _ := nd.st().Disagreements(); len(ds) != 0 {
			t.Fatalf("region %d still disagrees: %+v", i, ds)
		}
	}
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestReportRulesChecked: a report whose rule definitions are malformed is
// refused whole.
func TestReportRulesChecked(t *testing.T) {
	good := region.RuleDef{Name: "r", Fingerprint: 1, Limit: 10, Period: 1e9, Burst: 10, Cost: 1}
	for name, r := range map[string]region.Report{
		"rules without a policy": {Rules: []region.RuleDef{good}},
		"zero limit":             {Policy: "p", Rules: []region.RuleDef{{Name: "r", Period: 1e9, Burst: 1, Cost: 1}}},
		"burst under cost":       {Policy: "p", Rules: []region.RuleDef{{Name: "r", Limit: 1, Period: 1e9, Burst: 1, Cost: 2}}},
		"no name":                {Policy: "p", Rules: []region.RuleDef{{Limit: 1, Period: 1e9, Burst: 1, Cost: 1}}},
		"twice":                  {Policy: "p", Rules: []region.RuleDef{good, good}},
	} {
		st, err := region.New(region.Config{Self: "a", Regions: []string{"a", "b"}})
		if err != nil {
			t.Fatal(err)
		}
		r.Region, r.Replica, r.Epoch, r.Regions = "b", "0", 1, []string{"a", "b"}
		if err := st.Receive(time.Unix(1_700_000_000, 0), r); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
