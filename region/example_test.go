package region_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ration-dev/ration/region"
)

// exampleRegion is one region of the example: its Node, and the Effects
// the Node has carried out, on a map standing for the region's store and a
// network that delivers each report at once.
type exampleRegion struct {
	node   *region.Node
	store  map[string]int64 // applied shares, as regiond's store keeps them
	saved  *region.Snapshot // the persisted exchange state
	others *[]*exampleRegion
	now    *time.Time
}

func (r *exampleRegion) WriteShares(_ context.Context, cs []region.ShareChange) []region.ShareChange {
	for _, c := range cs {
		r.store[c.Key] = c.SharePPM
	}
	return cs
}

func (r *exampleRegion) DeleteShares(_ context.Context, keys []string) {
	for _, k := range keys {
		delete(r.store, k)
	}
}

func (r *exampleRegion) Incarnation(context.Context) (string, error) { return "one", nil }

func (r *exampleRegion) Persist(_ context.Context, snap *region.Snapshot) error {
	r.saved = region.MergeSnapshot(r.saved, snap)
	return nil
}

func (r *exampleRegion) Load(context.Context) (*region.Snapshot, error) { return r.saved, nil }

func (r *exampleRegion) Publish(ctx context.Context, rep *region.Report) {
	for _, to := range *r.others {
		if to != r {
			if err := to.node.Receive(ctx, *r.now, rep); err != nil {
				fmt.Println(err)
			}
		}
	}
}

// Two regions share one global key. Europe asks for 900 tokens per epoch
// of a 1,000 tokens/s quota and the US for 100; starting from an equal
// split, share moves to Europe until the max-min targets (US: its need plus
// headroom for the noise of 100 requests an epoch; Europe: the rest) are
// reached. Each epoch has two phases: every region publishes its tallies
// (Tally), then decides on them all (Decide), lowering its share before it
// gives; the receiver writes a gift when the report announcing it arrives
// (Receive). The shares never sum above PPM on the way. Demand is smoothed
// (α 0.9, from the even split the regions start with), so the move
// completes in the second epoch, to within MinTransferPPM (1,000 ppm:
// smaller surpluses are not worth moving).
func Example() {
	ctx := context.Background()
	names := []string{"eu", "us"}
	policy := func(string) region.KeyPolicy { return region.KeyPolicy{Rate: 1000} }
	start := time.Unix(1_700_000_000, 0)
	now := start // what the regions' clocks read
	var regions []*exampleRegion
	for _, name := range names {
		r := &exampleRegion{store: map[string]int64{}, others: &regions, now: &now}
		r.node, _ = region.NewNode(region.Config{Self: name, Regions: names, Policy: policy}, r)
		r.node.Hold(ctx, region.HoldTaken) // one replica a region: it holds the election
		regions = append(regions, r)
	}
	eu, us := regions[0], regions[1]
	key := "transfers-per-tenant/acme"
	for epoch := 1; epoch <= 4; epoch++ {
		now = start.Add(time.Duration(epoch) * time.Second)
		eu.node.Observe(key, 900, 900)
		us.node.Observe(key, 100, 100)
		for _, r := range regions {
			r.node.Tally(ctx, now)
		}
		now = now.Add(250 * time.Millisecond)
		for _, r := range regions {
			r.node.Decide(ctx, now)
		}
		fmt.Printf("epoch %d: eu %d, us %d\n", epoch, eu.store[key], us.store[key])
	}
	// Output:
	// epoch 1: eu 869486, us 130514
	// epoch 2: eu 891903, us 108097
	// epoch 3: eu 890256, us 109744
	// epoch 4: eu 890256, us 109744
}
