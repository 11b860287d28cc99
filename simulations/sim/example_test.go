package sim_test

import (
	"fmt"

	"github.com/ration-dev/ration/simulations/sim"
)

// A scenario is YAML; Run simulates it with one algorithm and checks every
// window of admitted traffic against the bound.
func Example() {
	sc, err := sim.Parse("example.yaml", []byte(`
name: example
seed: 1
duration: 5s
regions: [us, eu]
agents_per_region: 3
keys:
  - { name: acme, limit: 1000, burst: 2000 }
demand:
  - { at: 0s, rates: { us: 1500, eu: 300 } }
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := sim.Run(sc, sim.Options{Algorithm: sim.Escrow})
	if err != nil {
		fmt.Println(err)
		return
	}
	s := res.Summary
	fmt.Println("within the bound:", s.BoundRatioMax <= 1)
	fmt.Println("admitted at most L·5s + B:", float64(s.Admitted) <= 1000*5+*s.BoundTokens.S1)
	// Output:
	// within the bound: true
	// admitted at most L·5s + B: true
}
