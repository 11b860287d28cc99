package codec

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// steerRegion is one region of steerWorld: its Node and the Effects it
// carries out on a map of applied shares, a saved snapshot, and a network
// that delivers each report at once.
type steerRegion struct {
	t       *testing.T
	node    *region.Node
	shares  map[string]int64
	saved   *region.Snapshot
	restore func(*region.Snapshot) *region.Snapshot // what Load hands back of saved
	world   *steerWorld
}

func (r *steerRegion) WriteShares(_ context.Context, cs []region.ShareChange) []region.ShareChange {
	for _, c := range cs {
		r.shares[c.Key] = c.SharePPM
	}
	return cs
}

func (r *steerRegion) DeleteShares(_ context.Context, keys []string) {
	for _, k := range keys {
		delete(r.shares, k)
	}
}

func (r *steerRegion) Incarnation(context.Context) (string, error) { return "one", nil }

func (r *steerRegion) Persist(_ context.Context, snap *region.Snapshot) error {
	r.saved = region.MergeSnapshot(r.saved, snap)
	return nil
}

func (r *steerRegion) Load(context.Context) (*region.Snapshot, error) { return r.restore(r.saved), nil }

func (r *steerRegion) Publish(ctx context.Context, rep *region.Report) {
	for _, to := range r.world.regions {
		if to != r {
			if err := to.node.Receive(ctx, r.world.now, rep); err != nil {
				r.t.Fatal(err)
			}
		}
	}
}

// steerWorld is three regions sharing steerKeys keys of Poisson demand.
type steerWorld struct {
	regions []*steerRegion
	now     time.Time
	mean    [][]float64 // [key][region] requests an epoch
}

const steerKeys = 60

func newSteerWorld(t *testing.T, restore func(*region.Snapshot) *region.Snapshot) *steerWorld {
	names := []string{"ap", "eu", "us"}
	w := &steerWorld{now: time.Unix(1_700_000_000, 0)}
	rates := make(map[string]float64)
	mrng := rand.New(rand.NewPCG(1, 1)) // the keys' means: the same in every world
	for k := range steerKeys {
		var total float64
		row := make([]float64, len(names))
		for r := range row {
			row[r] = math.Exp(mrng.Float64() * math.Log(5000)) // 1 to 5,000 an epoch
			total += row[r]
		}
		w.mean = append(w.mean, row)
		rates[steerKey(k)] = total * (0.8 + 0.4*mrng.Float64()) // about the demand: shares matter
	}
	policy := func(key string) region.KeyPolicy { return region.KeyPolicy{Rate: rates[key]} }
	for _, name := range names {
		r := &steerRegion{t: t, shares: map[string]int64{}, world: w, restore: func(s *region.Snapshot) *region.Snapshot { return s }}
		var err error
		if r.node, err = region.NewNode(region.Config{Self: name, Regions: names, Policy: policy}, r); err != nil {
			t.Fatal(err)
		}
		r.node.Hold(context.Background(), region.HoldTaken)
		w.regions = append(w.regions, r)
	}
	w.regions[1].restore = restore
	return w
}

func steerKey(k int) string { return fmt.Sprintf("r/k%02d", k) }

// epoch runs one epoch of demand drawn from rng, and returns every
// region's share of every key after it.
func (w *steerWorld) epoch(t *testing.T, rng *rand.Rand) [][]int64 {
	ctx := context.Background()
	w.now = w.now.Add(time.Second)
	for k := range steerKeys {
		for r, reg := range w.regions {
			n := poisson(rng, w.mean[k][r])
			reg.node.Observe(steerKey(k), n, n)
		}
	}
	for _, r := range w.regions {
		r.node.Tally(ctx, w.now)
	}
	w.now = w.now.Add(250 * time.Millisecond)
	for _, r := range w.regions {
		r.node.Decide(ctx, w.now)
	}
	w.now = w.now.Add(-250 * time.Millisecond)
	out := make([][]int64, steerKeys)
	for k := range out {
		for _, r := range w.regions {
			out[k] = append(out[k], r.shares[steerKey(k)])
		}
	}
	return out
}

// poisson draws a Poisson count of mean mu (normal above 50).
func poisson(rng *rand.Rand, mu float64) int64 {
	if mu > 50 {
		return max(0, int64(math.Round(mu+math.Sqrt(mu)*rng.NormFloat64())))
	}
	l, k, p := math.Exp(-mu), int64(0), 1.0
	for {
		p *= rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

// TestRestoredRegionSteersWithinTheNoise checks that quantising the smoothed
// demands in the persisted records (demandCode) leaves a restored region
// steering as it would from the exact state, within the noise of demand.
// Three regions share 60 keys of Poisson demand (1 to 5,000 requests an
// epoch in each); after 30 epochs Europe's holder steps down and takes over
// again, restoring its saved state, and 20 more epochs follow. The shares
// after each of them, restored through EncodeSnapshotParts and JoinSnapshot,
// are compared with the shares of the same world restored from the exact
// snapshot; and, as the noise, the exact world's with the demand of the
// last 20 epochs drawn again (another seed).
func TestRestoredRegionSteersWithinTheNoise(t *testing.T) {
	exact := func(s *region.Snapshot) *region.Snapshot { return s }
	recorded := func(s *region.Snapshot) *region.Snapshot {
		head, recs, err := EncodeSnapshotParts(s)
		if err != nil {
			t.Fatal(err)
		}
		snap, err := JoinSnapshot(head, snapshotKeys(s), recs)
		if err != nil {
			t.Fatal(err)
		}
		return &snap
	}
	seed := seed(t)
	run := func(restore func(*region.Snapshot) *region.Snapshot, after uint64) [][][]int64 {
		w := newSteerWorld(t, restore)
		rng := rand.New(rand.NewPCG(seed, 1))
		for range 30 {
			w.epoch(t, rng)
		}
		eu := w.regions[1].node
		eu.Hold(context.Background(), region.HoldNone)
		if ch := eu.Hold(context.Background(), region.HoldTaken); !ch.TookOver || ch.KeptOwn {
			t.Fatalf("take-over: %+v", ch)
		}
		rng = rand.New(rand.NewPCG(seed, after))
		var shares [][][]int64
		for range 20 {
			shares = append(shares, w.epoch(t, rng))
		}
		return shares
	}
	a, b, noise := run(exact, 2), run(recorded, 2), run(exact, 3)
	if again := run(exact, 2); maxDiff(a, again) != 0 {
		t.Fatalf("the same world twice differs by %d ppm: not deterministic", maxDiff(a, again))
	}
	dq, dn := maxDiff(a, b), maxDiff(a, noise)
	sq, sn := sumDiff(a, b), sumDiff(a, noise)
	t.Logf("shares after the restore: quantising the demands moved them by %d ppm at most, %d in all; the noise of demand by %d at most, %d in all", dq, sq, dn, sn)
	if dq*10 > dn || sq*100 > sn {
		t.Errorf("quantising moved shares by %d ppm at most and %d in all, more than a tenth and a hundredth of the noise's %d and %d", dq, sq, dn, sn)
	}
}

// maxDiff is the largest difference between two runs' shares.
func maxDiff(a, b [][][]int64) int64 {
	var d int64
	for e := range a {
		for k := range a[e] {
			for r := range a[e][k] {
				d = max(d, a[e][k][r]-b[e][k][r], b[e][k][r]-a[e][k][r])
			}
		}
	}
	return d
}

// sumDiff is the sum of the differences between two runs' shares.
func sumDiff(a, b [][][]int64) int64 {
	var d int64
	for e := range a {
		for k := range a[e] {
			for r := range a[e][k] {
				d += max(a[e][k][r]-b[e][k][r], b[e][k][r]-a[e][k][r])
			}
		}
	}
	return d
}
