package sim

import (
	"runtime/debug"
	"testing"
)

// BenchmarkSimulate runs the steady-uniform scenario (2 simulated minutes,
// 3 regions × 50 agents, 40,000 then 60,000 requests/s) and reports the
// wall time per decision: ration (escrow: every request through the
// agent's decision path) against baseline=ideal (one global bucket, one
// store call per request).
//
//	go test -run XXX -bench Simulate -benchtime 1x ./simulations/sim/
//
// The one-hour speed target is measured with cmd/simulate (README.md).
func BenchmarkSimulate(b *testing.B) {
	defer debug.SetGCPercent(debug.SetGCPercent(400)) // as cmd/simulate runs
	sc := load(b, "../scenarios/steady-uniform.yaml")
	for _, c := range []struct {
		name string
		alg  Algorithm
	}{{"ration", Escrow}, {"baseline=ideal", Ideal}} {
		b.Run(c.name, func(b *testing.B) {
			var requests int64
			for i := 0; i < b.N; i++ {
				res, err := Run(sc, Options{Algorithm: c.alg})
				if err != nil {
					b.Fatal(err)
				}
				requests += res.Summary.Requests
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(requests), "ns/decision")
		})
	}
}
