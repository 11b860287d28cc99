package sim

import (
	"cmp"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/region"
)

// TestSplitCeilingManySmallKeys measures what splitting a key into regional
// buckets can reach at best in many-small-keys, on the committed scenario's
// keys and demand: each region a perfect token bucket of rate L·s_r and
// capacity max(b·s_r, one cost) (the bound's), deciding at once, with no
// leases, no delays, and shares fixed: equal, the exchange's targets
// (region.Targets), by demand, and the best split for each limit, chosen on
// the very arrivals it is scored on. Utilization is the simulator's (Σ
// min(admitted, L) ÷ Σ L over the one-second windows whose demand was at
// least L), beside one bucket of rate L and capacity b fed the same
// arrivals. Issue 13 asks for 96% of the ideal's utilization; no fixed
// split reaches 90% of it, so most of the gap is the split itself, not the
// leases, the exchange's dynamics or the agents (docs/DESIGN.md, "Small
// keys split into regions"). The last line hands what a full region drops
// to the regions with room once an epoch, as an upper estimate of that
// idea: it ignores what the bound would need of it.
func TestSplitCeilingManySmallKeys(t *testing.T) {
	sc := load(t, "../scenarios/many-small-keys.yaml")
	if len(sc.Keys) != 1 || len(sc.Demand) != 1 || sc.Keys[0].Zipf != 0 {
		t.Fatalf("many-small-keys changed shape (%d groups, %d demand steps): the model reads one group spread evenly, one demand step", len(sc.Keys), len(sc.Demand))
	}
	g := sc.Keys[0]
	var demand []float64 // requests per second of one key in each region
	for _, r := range sc.Regions {
		demand = append(demand, sc.Demand[0].Rates[r]/float64(g.Count))
	}
	secs := int(sc.Duration.Seconds())
	splits := fixedSplits(len(demand), 10)
	var total float64
	for _, d := range demand {
		total += d
	}
	proportional := make([]int64, len(demand))
	for i, d := range demand {
		proportional[i] = int64(math.Round(d / total * region.PPM))
	}
	seed := sc.Seed
	t.Logf("seed %d (the scenario's)", seed)
	rng := rand.New(rand.NewPCG(seed, 0x73706c6974))
	equal := make([]int64, len(demand))
	for i := range equal {
		equal[i] = region.PPM / int64(len(demand))
	}
	// Keys of one limit share their best split; sums over every key.
	var ideal, prop, eq, water, best, spill, den float64
	limits := map[int64][]int{}
	for i := range g.Count {
		limits[g.keyLimit(i)] = append(limits[g.keyLimit(i)], i)
	}
	for _, l := range slices.Sorted(maps.Keys(limits)) {
		k := splitKey{Rate: float64(l), Burst: float64(g.keyBurst(l)), Cost: g.Cost}
		runs := make([]splitArrivals, len(limits[l]))
		for i := range runs {
			runs[i] = poissonArrivals(rng, demand, secs)
		}
		score := func(shares []int64, spill bool) (num, den float64) {
			for _, a := range runs {
				n, d := k.utilization(a, shares, spill, secs)
				num, den = num+n, den+d
			}
			return num, den
		}
		// The exchange's rule: max-min water-filling of the regions'
		// needs, with its default headroom (region.Config.FloorPPM).
		need := make([]float64, len(demand))
		for i, d := range demand {
			need[i] = d / k.Rate * region.PPM
		}
		targets := region.Targets(region.PPM, need, 5_000, nil)
		in, d := score(nil, false)
		pn, _ := score(proportional, false)
		en, _ := score(equal, false)
		wn, _ := score(targets, false)
		sn, _ := score(targets, true)
		bn := 0.0
		for _, s := range splits {
			n, _ := score(s, false)
			bn = max(bn, n)
		}
		ideal, prop, eq, water, best, spill, den = ideal+in, prop+pn, eq+en, water+wn, best+bn, spill+sn, den+d
	}
	pct := func(x float64) float64 { return 100 * x / den }
	t.Logf("one bucket (the ideal): %.2f%%", pct(ideal))
	t.Logf("regions split equally (the static algorithm): %.2f%% (%.1f%% of the ideal's)", pct(eq), 100*eq/ideal)
	t.Logf("regions split by the exchange's targets (max-min): %.2f%% (%.1f%% of the ideal's)", pct(water), 100*water/ideal)
	t.Logf("regions split by demand: %.2f%% (%.1f%% of the ideal's)", pct(prop), 100*prop/ideal)
	t.Logf("the best fixed split for each limit: %.2f%% (%.1f%% of the ideal's)", pct(best), 100*best/ideal)
	t.Logf("split by the exchange's targets, a full region's refill handed to the others each epoch: %.2f%% (%.1f%% of the ideal's)", pct(spill), 100*spill/ideal)
	// The model's ideal is the simulator's (96.16% in the committed table),
	// within the sampling noise of other arrivals.
	if math.Abs(pct(ideal)-96.16) > 0.5 {
		t.Errorf("the model's ideal is %.2f%%, the simulator's 96.16%%: the model no longer measures what the simulator does", pct(ideal))
	}
	if 100*best/ideal >= 96 {
		t.Errorf("a fixed split reaches %.1f%% of the ideal's utilization: the ceiling DESIGN.md states is wrong", 100*best/ideal)
	}
}

// splitKey is one key of the model: its rate L (tokens a second), burst b
// and cost, and lease.Limit's regional bucket at a share.
type splitKey lease.Limit

// splitArrivals are one key's requests: their times in seconds, sorted,
// and each one's region.
type splitArrivals struct {
	at     []float64
	region []int
}

// poissonArrivals draws one key's requests over secs seconds, Poisson at
// demand[r] a second in each region r.
func poissonArrivals(rng *rand.Rand, demand []float64, secs int) splitArrivals {
	type arrival struct {
		at float64
		r  int
	}
	var as []arrival
	for r, d := range demand {
		if d <= 0 {
			continue
		}
		for at := rng.ExpFloat64() / d; at < float64(secs); at += rng.ExpFloat64() / d {
			as = append(as, arrival{at, r})
		}
	}
	slices.SortFunc(as, func(a, b arrival) int { return cmp.Compare(a.at, b.at) })
	out := splitArrivals{at: make([]float64, len(as)), region: make([]int, len(as))}
	for i, a := range as {
		out.at[i], out.region[i] = a.at, a.r
	}
	return out
}

// modelBucket is a continuous token bucket, full at the start; spilled
// counts the refill it dropped while full.
type modelBucket struct{ rate, capacity, tokens, last, spilled float64 }

func (b *modelBucket) advance(t float64) {
	x := b.tokens + (t-b.last)*b.rate
	if x > b.capacity {
		b.spilled += x - b.capacity
		x = b.capacity
	}
	b.tokens, b.last = x, t
}

func (b *modelBucket) take(t, cost float64) bool {
	b.advance(t)
	if b.tokens >= cost {
		b.tokens -= cost
		return true
	}
	return false
}

// utilization runs one key's arrivals against one bucket (shares nil) or
// regional buckets at the given shares (ppm), each the store's
// (lease.Limit.Regional), and returns the simulator's utilization sums.
// With spill, what a full region drops in an epoch of one second is handed
// to the regions with room 100 ms after it ends (the exchange's delay),
// each credited up to its capacity.
func (k splitKey) utilization(a splitArrivals, shares []int64, spill bool, secs int) (num, den float64) {
	cost := float64(k.Cost)
	bs := []modelBucket{{rate: k.Rate, capacity: k.Burst, tokens: k.Burst}}
	if shares != nil {
		bs = bs[:0]
		for _, ppm := range shares {
			rate, capacity := lease.Limit(k).Regional(ppm)
			bs = append(bs, modelBucket{rate: rate, capacity: capacity, tokens: capacity})
		}
	}
	asked := make([]float64, secs)
	admitted := make([]float64, secs)
	next := 1.1
	for i, at := range a.at {
		for spill && at >= next {
			var pool float64
			for j := range bs {
				bs[j].advance(next)
				pool += bs[j].spilled
				bs[j].spilled = 0
			}
			for j := range bs {
				g := min(bs[j].capacity-bs[j].tokens, pool)
				bs[j].tokens += g
				pool -= g
			}
			next++
		}
		s := int(at)
		asked[s]++
		b := &bs[0]
		if shares != nil {
			b = &bs[a.region[i]]
		}
		if b.take(at, cost) {
			admitted[s]++
		}
	}
	for s := range secs {
		if asked[s]*cost >= k.Rate {
			den += k.Rate
			num += min(admitted[s]*cost, k.Rate)
		}
	}
	return num, den
}

// fixedSplits is every split of PPM into n shares in steps of PPM/steps.
func fixedSplits(n, steps int) [][]int64 {
	var out [][]int64
	var rec func(prefix []int64, left int)
	rec = func(prefix []int64, left int) {
		if len(prefix) == n-1 {
			s := append(slices.Clone(prefix), int64(left))
			for i := range s {
				s[i] = s[i] * region.PPM / int64(steps)
			}
			out = append(out, s)
			return
		}
		for p := 0; p <= left; p++ {
			rec(append(prefix, int64(p)), left-p)
		}
	}
	rec(nil, steps)
	return out
}
