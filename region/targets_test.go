package region_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/region"
)

func TestTargets(t *testing.T) {
	equal3 := []int64{333334, 333333, 333333}
	for _, tc := range []struct {
		name    string
		total   int64
		need    []float64
		floor   int64
		weights []int64
		want    []int64
	}{{
		name:  "nobody needs anything: floors plus the rest by weight, the initial shares",
		total: region.PPM, need: []float64{0, 0, 0}, floor: 20_000, weights: equal3,
		want: []int64{333334, 333333, 333333},
	}, {
		name:  "unequal weights spread the unused quota unequally",
		total: region.PPM, need: []float64{0, 0}, floor: 0, weights: []int64{750_000, 250_000},
		want: []int64{750_000, 250_000},
	}, {
		name:  "everyone served: need plus floor, the rest spread by weight",
		total: region.PPM, need: []float64{100_000, 200_000, 0}, floor: 20_000, weights: equal3,
		want: []int64{100_000 + 20_000 + 213_334, 200_000 + 20_000 + 213_333, 20_000 + 213_333},
	}, {
		name:  "contention: the small need is served, the hungry split the rest",
		total: region.PPM, need: []float64{100_000, 900_000, 900_000}, floor: 20_000, weights: equal3,
		want: []int64{120_000, 440_000, 440_000},
	}, {
		name:  "one hungry region takes what the others leave",
		total: region.PPM, need: []float64{0, 5 * region.PPM, 0}, floor: 20_000, weights: equal3,
		want: []int64{20_000, 960_000, 20_000},
	}, {
		name:  "equal needs split equally, remainder to the lower index",
		total: region.PPM, need: []float64{region.PPM, region.PPM, region.PPM}, floor: 20_000, weights: equal3,
		want: []int64{333334, 333333, 333333},
	}, {
		name:  "a smaller total (frozen peers hold the rest)",
		total: 600_000, need: []float64{500_000, 500_000}, floor: 20_000,
		want: []int64{300_000, 300_000},
	}, {
		name:  "negative and NaN needs count as zero",
		total: region.PPM, need: []float64{-5, math.NaN()}, floor: 0,
		want: []int64{500_000, 500_000},
	}, {
		name:  "no total",
		total: 0, need: []float64{1, 2}, floor: 20_000,
		want: []int64{0, 0},
	}, {
		name:  "no regions",
		total: region.PPM, need: nil,
		want: []int64{},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := region.Targets(tc.total, tc.need, tc.floor, tc.weights)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Targets(%d, %v, %d, %v) = %v, want %v (-want +got):\n%s", tc.total, tc.need, tc.floor, tc.weights, got, tc.want, diff)
			}
		})
	}
}

// checkTargets checks the properties every result of Targets must have.
func checkTargets(t *testing.T, total int64, need []float64, floor int64, weights []int64, got []int64) {
	t.Helper()
	if len(got) != len(need) {
		t.Fatalf("Targets(%d, %v): got %d targets, want %d", total, need, len(got), len(need))
	}
	var sum int64
	for _, v := range got {
		if v < 0 {
			t.Fatalf("Targets(%d, %v, %d, %v) = %v: got a negative target", total, need, floor, weights, got)
		}
		sum += v
	}
	want := max(total, 0)
	if len(need) == 0 {
		want = 0
	}
	if sum != want {
		t.Fatalf("Targets(%d, %v, %d, %v) = %v: got sum %d, want %d", total, need, floor, weights, got, sum, want)
	}
}

// TestTargetsProperties checks on random inputs: the targets sum exactly to
// the total; raising one region's need never lowers its target by more than
// the 1 ppm of rounding; equal needs with equal weights give shares within
// 1 ppm; a region asking no more than an equal split gets at least its ask.
func TestTargetsProperties(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i < 20_000; i++ {
		n := 1 + rng.IntN(7)
		total := int64(rng.IntN(region.PPM + 1))
		floor := int64(rng.IntN(int(region.PPM/int64(n)) + 1))
		need := make([]float64, n)
		weights := make([]int64, n)
		for r := range need {
			if rng.IntN(4) > 0 {
				need[r] = rng.Float64() * 1.5 * region.PPM
			}
			weights[r] = int64(rng.IntN(region.PPM / n))
		}
		got := region.Targets(total, need, floor, weights)
		checkTargets(t, total, need, floor, weights, got)

		// Monotone in demand.
		r := rng.IntN(n)
		more := append([]float64(nil), need...)
		more[r] += rng.Float64() * region.PPM
		after := region.Targets(total, more, floor, weights)
		if after[r] < got[r]-1 {
			t.Fatalf("seed %d: raising need[%d] from %v to %v lowered its target: got %d, want ≥ %d (needs %v, total %d, floor %d)",
				seed, r, need[r], more[r], after[r], got[r]-1, need, total, floor)
		}

		// A region asking no more than an equal split gets its ask.
		for r := range need {
			if ask := need[r] + float64(floor); ask <= float64(total)/float64(n) && float64(got[r]) < ask-1 {
				t.Fatalf("seed %d: region %d asks %v ≤ an equal split of %d: got %d, want ≥ %v (needs %v, floor %d)",
					seed, r, ask, total, got[r], ask-1, need, floor)
			}
		}

		// Equal needs, equal weights: equal shares.
		same := make([]float64, n)
		for r := range same {
			same[r] = need[0]
		}
		eq := region.Targets(total, same, floor, nil)
		checkTargets(t, total, same, floor, nil, eq)
		for r := range eq {
			if d := eq[r] - eq[0]; d > 1 || d < -1 {
				t.Fatalf("seed %d: equal needs %v gave unequal targets %v", seed, same, eq)
			}
		}
	}
}

func FuzzTargets(f *testing.F) {
	f.Add(int64(region.PPM), 100_000.0, 900_000.0, 900_000.0, int64(20_000))
	f.Add(int64(0), 1.0, 2.0, 3.0, int64(0))
	f.Add(int64(600_000), math.Inf(1), math.NaN(), -1.0, int64(333_333))
	f.Fuzz(func(t *testing.T, total int64, a, b, c float64, floor int64) {
		if total > region.PPM || total < -region.PPM || floor < 0 || floor > region.PPM/3 {
			t.Skip()
		}
		need := []float64{a, b, c}
		got := region.Targets(total, need, floor, nil)
		checkTargets(t, total, need, floor, nil, got)
	})
}
