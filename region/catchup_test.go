package region

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestWakeAsReplay checks wake (each region caught up on its own, catchUp)
// against the replay it stands for: whole epochs of follow for every
// region, until one changes nothing or the epochs rested through are done.
// The smoothed demands, the missed requests and the move bits must be the
// same bit for bit, over seeded random keys: with and without rates,
// bursts, costs and fixed windows, tallies of nothing, a few requests or
// many, smoothed demands above and below them, and any move bits.
func TestWakeAsReplay(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("RATION_SEED"), 10, 64); err == nil && v != 0 {
		seed = v
	}
	t.Logf("seed %d (replay: RATION_SEED=%d go test ./region -run TestWakeAsReplay)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	cases := 20000
	if testing.Short() {
		cases = 3000
	}
	for c := 0; c < cases; c++ {
		n := 2 + rng.IntN(3)
		regions := []string{"a", "b", "c", "d"}[:n]
		var pol KeyPolicy
		if rng.IntN(4) > 0 {
			pol.Rate = []float64{1, 10, 1000, 100_000}[rng.IntN(4)]
			pol.Burst = pol.Rate * []float64{0, 0.5, 1, 3, 60}[rng.IntN(5)]
		}
		pol.Cost = []float64{0, 1, 5}[rng.IntN(3)]
		pol.FixedWindow = rng.IntN(8) == 0
		self := rng.IntN(n)
		s, err := New(Config{Self: regions[self], Regions: regions, Policy: func(string) KeyPolicy { return pol }})
		if err != nil {
			t.Fatal(err)
		}
		a, b := s.addKey("a"), s.addKey("b")
		for k := 0; k < n; k++ {
			x := randDemand(rng, pol)
			e := x
			switch rng.IntN(4) {
			case 0:
				e = randDemand(rng, pol)
			case 1:
				e = x * (0.5 + rng.Float64())
			case 2:
				e = math.Nextafter(x, math.Inf(1))
			}
			ms, rb := 0.0, 0.0
			if rng.IntN(3) == 0 {
				rb = e / perRequest(pol.Cost)
				ms = rb * float64(rng.IntN(4))
			}
			share := rng.Int64N(PPM)
			for _, ks := range []*keyState{a, b} {
				ks.restX()[k], ks.ewma()[k], ks.missed()[k], ks.runBase()[k] = x, e, ms, rb
				ks.shares()[k] = share
			}
		}
		base := rng.Int64N(PPM)
		moved, rose, flipped := rng.Uint64()&(1<<n-1), rng.Uint64()&(1<<n-1), rng.Uint64()&(1<<n-1)
		skipped := uint64(1 + rng.IntN(600))
		for _, ks := range []*keyState{a, b} {
			ks.base, ks.moved, ks.rose, ks.flipped = base, moved, rose, flipped
			ks.visit = 1
		}
		s.epochs = 1 + skipped
		s.wake(a)
		replay(s, b, pol, skipped)
		if msg := sameFollow(a, b); msg != "" {
			t.Fatalf("seed %d case %d (n %d self %d policy %+v, %d epochs): %s", seed, c, n, self, pol, skipped, msg)
		}
	}
}

// randDemand is a tally of nothing, a few requests or many.
func randDemand(rng *rand.Rand, pol KeyPolicy) float64 {
	switch rng.IntN(5) {
	case 0:
		return 0
	case 1:
		return float64(1 + rng.IntN(10))
	case 2:
		return rng.Float64() * 3
	}
	return math.Round(rng.ExpFloat64() * max(pol.Rate, 100))
}

// replay is wake as whole epochs of follow, as it was before catchUp.
func replay(s *State, ks *keyState, pol KeyPolicy, skipped uint64) {
	for i := uint64(0); i < skipped; i++ {
		copy(s.x, ks.restX())
		e, m, r := slices.Clone(ks.ewma()), slices.Clone(ks.missed()), slices.Clone(ks.runBase())
		bits := [3]uint64{ks.moved, ks.rose, ks.flipped}
		for k := 0; k < s.n; k++ {
			s.follow(ks, k, pol)
		}
		if slices.Equal(e, ks.ewma()) && slices.Equal(m, ks.missed()) && slices.Equal(r, ks.runBase()) &&
			bits == [3]uint64{ks.moved, ks.rose, ks.flipped} {
			return
		}
	}
}

func sameFollow(a, b *keyState) string {
	for i := range a.flts() {
		if math.Float64bits(a.flts()[i]) != math.Float64bits(b.flts()[i]) {
			return fmt.Sprintf("flts %v, replayed %v", a.flts(), b.flts())
		}
	}
	if a.moved != b.moved || a.rose != b.rose || a.flipped != b.flipped {
		return fmt.Sprintf("moved/rose/flipped %b/%b/%b, replayed %b/%b/%b", a.moved, a.rose, a.flipped, b.moved, b.rose, b.flipped)
	}
	return ""
}
