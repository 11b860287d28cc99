//go:build !race

package exchange

import "time"

// TestOverloadedStoreRecovers's period, and whether it counts step-downs
// and failed saves (race_on_test.go).
const (
	overloadPeriod = 200 * time.Millisecond
	overloadStrict = true
)
