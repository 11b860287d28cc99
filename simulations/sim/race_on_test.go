//go:build race

package sim

// raceEnabled: the race detector makes a simulation about ten times
// slower, so the randomised tests run fewer scenarios under it.
const raceEnabled = true
