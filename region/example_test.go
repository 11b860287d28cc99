package region_test

import (
	"fmt"
	"time"

	"github.com/ration-dev/ration/region"
)

// Two regions share one global key. Europe asks for 900 tokens per epoch
// of a 1,000 tokens/s quota and the US for 100; starting from an equal
// split, share moves to Europe until the max-min targets (US: its need plus
// headroom for the noise of 100 requests an epoch; Europe: the rest) are reached. Each epoch has two phases:
// every region publishes its tallies (Tally), then decides on them all
// (Epoch), lowering its share before it gives; the receiver applies a gift
// when the report announcing it arrives (Apply). The shares never sum above
// PPM on the way. Demand is smoothed (α 0.9, from the even split the
// regions start with), so the move completes in the second epoch, to within
// MinTransferPPM (1,000 ppm: smaller surpluses are not worth moving).
func Example() {
	regions := []string{"eu", "us"}
	policy := func(string) region.KeyPolicy { return region.KeyPolicy{Rate: 1000} }
	eu, _ := region.New(region.Config{Self: "eu", Regions: regions, Policy: policy})
	us, _ := region.New(region.Config{Self: "us", Regions: regions, Policy: policy})
	states := []*region.State{eu, us}
	key := region.GlobalKey("transfers-per-tenant", "acme")

	store := map[string]int64{} // the applied shares, as regiond's store keeps them
	send := func(from *region.State, rep region.Report, now time.Time) {
		for _, to := range states {
			if to == from {
				continue
			}
			if err := to.Receive(now, rep); err != nil {
				fmt.Println(err)
			}
			for _, c := range to.Apply() { // gifts in use on arrival
				store[to.Config().Self+"/"+c.Key] = c.SharePPM
			}
		}
	}
	now := time.Unix(1_700_000_000, 0)
	for epoch := 1; epoch <= 4; epoch++ {
		now = now.Add(time.Second)
		eu.Observe(key, 900, 900)
		us.Observe(key, 100, 100)
		for _, st := range states {
			send(st, st.Tally(now), now)
		}
		decide := now.Add(250 * time.Millisecond)
		for _, st := range states {
			self := st.Config().Self
			plan := st.Epoch(decide)
			for _, c := range plan.Lower { // lower first...
				store[self+"/"+c.Key] = c.SharePPM
			}
			if err := st.Commit(plan); err != nil { // ...then give
				fmt.Println(err)
			}
			// (persist st.Snapshot() in the region's store here)
			send(st, st.Report(), decide)
			for _, c := range plan.Raise {
				store[self+"/"+c.Key] = c.SharePPM
			}
		}
		fmt.Printf("epoch %d: eu %d, us %d\n", epoch, eu.Share(key), us.Share(key))
	}
	// Output:
	// epoch 1: eu 869486, us 130514
	// epoch 2: eu 891903, us 108097
	// epoch 3: eu 890256, us 109744
	// epoch 4: eu 890256, us 109744
}
