//go:build race

package exchange

import "time"

// TestOverloadedStoreRecovers's period, and whether it counts step-downs
// and failed saves: under the race detector on a loaded test machine the
// loop stalls for seconds at a time (a save to the memory coordinator was
// seen to take 6s), longer than any hold, so there it checks only that the
// region settles.
const (
	overloadPeriod = 500 * time.Millisecond
	overloadStrict = false
)
