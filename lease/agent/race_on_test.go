//go:build race

package agent

// raceEnabled: sync.Pool drops pooled items at random under the race
// detector, so allocation counts mean nothing there.
const raceEnabled = true
