package policy

import (
	"flag"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var seedFlag = flag.Uint64("policy.seed", 0, "seed for the randomised tests (0: pick one from the clock)")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newRand returns a generator for a randomised test and logs its seed, so a
// failure can be replayed with -policy.seed.
func newRand(t testing.TB) *rand.Rand {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -policy.seed=%d)", seed, seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}
