package region

// Awake counts, for the latest Epoch, the keys it visited by what woke
// them, and the keys it kept awake by what kept them (docs/DESIGN.md, "Keys
// at rest"): an epoch's cost follows its visits, and these say which of
// the protocol's steps they were.
type Awake struct {
	Epoch uint64 // the epochs run: a count that changes with each Epoch
	// Visited by what woke them: every key, when something all keys read
	// changed or keys may not rest this epoch (calm); a timer of the key's
	// own; or a touch (its tally, a peer's listing, a store write, a key
	// awake since its last epoch).
	All, Timer, Touched int
	// Kept awake, by the first reason found (awakeReasons names them).
	Kept [awakeReasons]int
}

// awakeReason is what kept a visited key awake.
type awakeReason uint8

const (
	awakeNone      awakeReason = iota
	awakeNoRest                // keys may not rest this epoch (calm)
	awakeMoved                 // its epoch planned a step or retired it
	awakeChanged               // its epoch changed its state (restMark)
	awakeUnapplied             // its stored share is not known
	awakeExits                 // exit records, ours or a peer's
	awakeToApply               // a gift waits for Apply
	awakeUnsettled             // gifts not acknowledged
	awakeUnknown               // a peer's state for it is not known
	awakeReclaim               // a reclaim could come due
	awakeUnsteady              // its smoothed demand could still make it give
	awakeReasons
)

// AwakeReasons names Awake.Kept's entries, as metric labels; "" at 0.
var AwakeReasons = [awakeReasons]string{"", "no-rest", "moved", "changed", "unapplied", "exits", "to-apply", "unsettled", "unknown", "reclaim", "unsteady"}

// countVisit counts a visited key by what woke it: rest is whether keys
// may rest this epoch, meta its keyMeta.rest.
func (a *Awake) countVisit(rest bool, meta uint8) {
	switch {
	case !rest:
		a.All++
	case meta != restAwake:
		a.Timer++
	default:
		a.Touched++
	}
}

// Awake returns why the latest Epoch visited keys and kept them awake.
func (s *State) Awake() Awake {
	a := s.awake
	a.Epoch = s.epochs
	return a
}
