package region_test

import (
	"fmt"
	"time"

	"github.com/ration-dev/ration/region"
)

// Two regions share one global key. Europe asks for 900 tokens per epoch
// of a 1,000 tokens/s quota and the US for 100; starting from an equal
// split, share moves to Europe until the max-min targets (US: its need plus
// a 2% floor; Europe: the rest) are reached. The shares never sum above PPM
// on the way: in epoch 2 the US has given 400,000 ppm that Europe applies
// only in epoch 3, when the US report reaches it.
func Example() {
	regions := []string{"eu", "us"}
	policy := func(string) region.KeyPolicy { return region.KeyPolicy{Rate: 1000} }
	eu, _ := region.New(region.Config{Self: "eu", Regions: regions, Policy: policy})
	us, _ := region.New(region.Config{Self: "us", Regions: regions, Policy: policy})
	key := region.GlobalKey("transfers-per-tenant", "acme")

	store := map[string]int64{}            // the applied shares, as regiond's store keeps them
	outbox := map[string][]region.Report{} // reports published, delivered next epoch
	now := time.Unix(1_700_000_000, 0)
	for epoch := 1; epoch <= 5; epoch++ {
		now = now.Add(time.Second)
		inbox := outbox
		outbox = map[string][]region.Report{}
		eu.Observe(key, 900, 900)
		us.Observe(key, 100, 100)
		for _, st := range []*region.State{eu, us} {
			self := st.Config().Self
			for _, rep := range inbox[self] {
				if err := st.Receive(now, rep); err != nil {
					fmt.Println(err)
				}
			}
			plan := st.Epoch(now)
			for _, c := range plan.Lower { // lower first...
				store[self+"/"+c.Key] = c.SharePPM
			}
			if err := st.Commit(plan); err != nil { // ...then give
				fmt.Println(err)
			}
			// (persist st.Snapshot() in the region's store here)
			for _, peer := range regions {
				if peer != self {
					outbox[peer] = append(outbox[peer], st.Report())
				}
			}
			for _, c := range plan.Raise {
				store[self+"/"+c.Key] = c.SharePPM
			}
		}
		fmt.Printf("epoch %d: eu %d, us %d\n", epoch, eu.Share(key), us.Share(key))
	}
	// Output:
	// epoch 1: eu 500000, us 500000
	// epoch 2: eu 500000, us 100000
	// epoch 3: eu 880000, us 100000
	// epoch 4: eu 880000, us 120000
	// epoch 5: eu 880000, us 120000
}
