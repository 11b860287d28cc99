package region

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Effects are what a Node has its caller carry out: the region's store, its
// persisted exchange state and the network. A Node calls them in the order
// the protocol's safety rests on (docs/DESIGN.md, "The exchange protocol"),
// from the goroutine that called the Node; the caller never orders them
// itself. sync/exchange implements them over Redis and NATS, the simulator
// over its modelled store and network.
type Effects interface {
	// WriteShares writes applied shares to the region's store, with the
	// tokens received (ShareChange.Received), and returns the changes it
	// wrote, in their order, each with the tokens the store released
	// (ShareChange.Released); a failed write is left out.
	WriteShares(ctx context.Context, cs []ShareChange) []ShareChange
	// DeleteShares deletes the applied shares of retired keys, so that
	// their buckets fall back to the initial share. A failure is harmless:
	// the store keeps a share this region holds.
	DeleteShares(ctx context.Context, keys []string)
	// Incarnation identifies the store's life: it changes whenever the
	// store may have lost writes (lease's Incarnation).
	Incarnation(ctx context.Context) (string, error)
	// Persist stores snap as the region's exchange state, atomically: whole,
	// or, when snap.Partial, applied to the state stored before
	// (MergeSnapshot). After an error the next snap is whole. An error
	// wrapping ErrNotHolder says another replica runs the exchange.
	Persist(ctx context.Context, snap *Snapshot) error
	// Load returns the region's persisted exchange state, nil when there is
	// none; an error wrapping ErrMalformed when it cannot be used.
	Load(ctx context.Context) (*Snapshot, error)
	// Publish sends a report to every region.
	Publish(ctx context.Context, rep *Report)
}

// ErrNotHolder is wrapped by an Effects.Persist error when this replica does
// not hold its region's holder election: nothing was written, and the Node
// stops running the exchange.
var ErrNotHolder = errors.New("region: not the exchange's holder")

// Hold is what a replica learnt of its region's holder election at the start
// of an epoch: one replica of a region, the holder, runs its exchange.
type Hold uint8

const (
	// HoldNone: another replica holds the election; the state it persists
	// is the region's.
	HoldNone Hold = iota
	// HoldTaken: the election was free (never held, lapsed or released)
	// and this replica took it. If it believed it held it, it had lapsed,
	// and another replica may have run the exchange since.
	HoldTaken
	// HoldRenewed: this replica held the election and still does.
	HoldRenewed
	// HoldUnknown: this replica cannot tell whether it still holds the
	// election long enough to write safely (the store did not answer).
	HoldUnknown
)

// HoldChange says what Node.Hold did.
type HoldChange struct {
	// SteppedDown: the replica stopped running the exchange; Lapsed says
	// it was because its hold had lapsed (taken again afresh).
	SteppedDown, Lapsed bool
	// TookOver: the replica now runs the exchange, restored from the
	// persisted state or, KeptOwn, with the state it had dropped, the
	// store holding none or an older one (it lost writes).
	TookOver, KeptOwn bool
	// Err is why a take-over failed; the next Hold tries again. It wraps
	// ErrMalformed or ErrUnknownRegion when the persisted state is
	// unusable.
	Err error
}

// Decided says what Node.Decide did.
type Decided struct {
	// Ran: this replica runs the exchange and decided this epoch.
	Ran bool
	// Resynced: the store was a new incarnation, so every share was written
	// again before anything was given.
	Resynced bool
	// SteppedDown: persisting found another replica holding the election.
	SteppedDown bool
	// Err is why nothing was published: the state was not persisted (so
	// announcing the gifts could lose them), or, a bug, the plan did not
	// commit.
	Err error
}

// Node is one replica's side of the exchange protocol: a State, and the
// order in which its decisions reach the store, the persisted state and the
// network. The order is the safety argument, and it lives here only; the
// caller feeds the Node time, reports and what it learnt of the holder
// election, and carries out the Effects it is handed.
//
// Each epoch the caller calls Hold, Tally, and (Config.Period / 4 or so
// later) Decide; it passes every report it receives to Receive, and local
// demand to Observe. Only the holder decides and merges reports; the other
// replicas publish their tallies.
//
// A Node is not safe for concurrent use; it does no I/O of its own.
type Node struct {
	cfg     Config
	fx      Effects
	st      *State
	prev    *State // the state dropped at a step-down, until another holder is seen
	holding bool
}

// NewNode returns a Node for cfg that does not run the exchange until a Hold
// says it holds the election. The error wraps ErrInvalidConfig.
func NewNode(cfg Config, fx Effects) (*Node, error) {
	st, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if fx == nil {
		return nil, fmt.Errorf("%w: no Effects", ErrInvalidConfig)
	}
	return &Node{cfg: st.Config(), fx: fx, st: st}, nil
}

// Config returns the configuration in force, defaults filled.
func (n *Node) Config() Config { return n.cfg }

// Holding reports whether this replica runs its region's exchange.
func (n *Node) Holding() bool { return n.holding }

// Initial returns the initial share of region in ppm (State.Initial).
func (n *Node) Initial(region string) int64 { return n.st.Initial(region) }

// Keys returns the number of keys the exchange state holds (State.Keys).
func (n *Node) Keys() int { return n.st.Keys() }

// Share returns this region's applied share of key in ppm (State.Share).
func (n *Node) Share(key string) int64 { return n.st.Share(key) }

// Observe adds local tallies of a global key (State.Observe).
func (n *Node) Observe(key string, demand, granted int64) { n.st.Observe(key, demand, granted) }

// Resting is State.Resting.
func (n *Node) Resting() (resting, keys int) { return n.st.Resting() }

// Awake is State.Awake.
func (n *Node) Awake() Awake { return n.st.Awake() }

// PolicyChanged is State.PolicyChanged: call it when the policy may have
// changed.
func (n *Node) PolicyChanged() { n.st.PolicyChanged() }

// Disagreements is State.Disagreements: the rules held because a replica
// heard defines them otherwise, as of the latest Tally or Epoch.
func (n *Node) Disagreements() ([]Disagreement, uint64) { return n.st.Disagreements() }

// DisagreementGen is State.DisagreementGen.
func (n *Node) DisagreementGen() uint64 { return n.st.DisagreementGen() }

// Hold takes what the replica learnt of its region's holder election at the
// start of an epoch: a replica that no longer holds it (or took it afresh
// after it lapsed) drops its state, and one that now holds it takes over
// from the persisted state. The state dropped is kept aside until another
// replica is seen holding the election: a store that then holds no newer
// state lost writes, and taking over from it would give again what this
// replica already gave.
func (n *Node) Hold(ctx context.Context, h Hold) HoldChange {
	var ch HoldChange
	if h == HoldNone {
		n.prev = nil // another replica holds it: its state counts
	}
	held := h == HoldTaken || h == HoldRenewed
	if n.holding && (h == HoldTaken || !held) {
		// Taken afresh while we believed we held it: it had lapsed, and only
		// the persisted state knows what another replica did since.
		ch.SteppedDown, ch.Lapsed = true, h == HoldTaken
		n.stepDown()
	}
	if held && !n.holding {
		ch.KeptOwn, ch.Err = n.takeOver(ctx)
		ch.TookOver = ch.Err == nil
	}
	return ch
}

// takeOver restores the region's persisted state, or keeps the state this
// replica dropped when the store holds none or an older one.
func (n *Node) takeOver(ctx context.Context) (keptOwn bool, err error) {
	snap, err := n.fx.Load(ctx)
	if err != nil {
		if errors.Is(err, ErrMalformed) {
			n.prev = nil
		}
		return false, fmt.Errorf("region: loading the persisted exchange state: %w", err)
	}
	// Only a holder persists, before it publishes: a newer state than ours
	// is another replica's, which we would have seen holding (forgetting
	// prev). None, or an older one, means the store lost writes.
	if n.prev != nil && (snap == nil || snap.Epoch < n.prev.LastEpoch()) {
		n.st, n.prev = n.prev, nil
		n.st.ResyncAll() // the shares we wrote went with the rest
		n.st.restartStreams()
		n.st.SaveFailed() // and the state we saved: the next snapshot is whole
		n.holding = true
		return true, nil
	}
	n.prev = nil
	if snap != nil {
		if err := n.st.Restore(*snap); err != nil {
			// Starting afresh could give twice what the lost state gave.
			return false, fmt.Errorf("region: restoring the persisted exchange state: %w", err)
		}
	}
	n.st.restartStreams() // peers' listings of the old holder's stream are void
	n.holding = true
	return false, nil
}

// stepDown drops the exchange state (kept aside as prev): the persisted one
// counts, and the next take-over restores it.
func (n *Node) stepDown() {
	st, err := New(n.cfg)
	if err != nil {
		panic(err) // the same config made n.st
	}
	if n.holding {
		n.prev = n.st
	}
	n.st, n.holding = st, false
}

// Tally closes the local tallies of the epoch starting at now and publishes
// them at once (the first phase of an epoch; State.Tally).
func (n *Node) Tally(ctx context.Context, now time.Time) {
	rep := n.st.Tally(now)
	n.fx.Publish(ctx, &rep)
}

// Decide ends the holder's epoch at now: it checks the store's incarnation,
// decides (State.Epoch), lowers shares in the store, commits the gifts,
// persists the state, publishes the report, raises shares and deletes those
// of retired keys, in that order. Lowering before committing means no
// share is ever visible to a peer while this region still applies it;
// persisting before publishing means a successor never forgets a gift a
// peer may have seen. A replica that does not hold the election does
// nothing.
func (n *Node) Decide(ctx context.Context, now time.Time) Decided {
	if !n.holding {
		return Decided{}
	}
	d := Decided{Ran: true}
	if inc, err := n.fx.Incarnation(ctx); err == nil {
		// A store that may have lost writes gets every share written again
		// before anything is given; a failed read changes nothing.
		d.Resynced = n.st.SawStore(inc)
	}
	plan := n.st.Epoch(now)
	if len(plan.Lower) > 0 {
		plan.Lower = n.fx.WriteShares(ctx, plan.Lower)
		n.st.Wrote(plan.Lower)
	}
	if err := n.st.Commit(plan); err != nil {
		d.Err = err
		return d
	}
	snap := n.st.SnapshotChanges()
	if err := n.fx.Persist(ctx, &snap); err != nil {
		n.st.SaveFailed()
		d.Err = fmt.Errorf("region: persisting the exchange state: %w", err)
		if errors.Is(err, ErrNotHolder) {
			d.SteppedDown = true
			n.stepDown()
		}
		return d
	}
	n.st.Saved()
	rep := n.st.Report()
	n.fx.Publish(ctx, &rep)
	n.raise(ctx, plan.Raise)
	if len(plan.Retire) > 0 {
		n.fx.DeleteShares(ctx, plan.Retire)
	}
	return d
}

// Receive merges a report received at now (State.Receive) and writes the
// shares that its gifts raised (State.Apply): a gift is in use a network
// delay after it is given. Only the holder merges; another replica ignores
// reports, and the holder to come learns everything again from the next
// ones. The error is State.Receive's.
func (n *Node) Receive(ctx context.Context, now time.Time, rep *Report) error {
	if !n.holding {
		n.st.watchStream(rep) // a new holder elsewhere needs our full tallies
		return nil
	}
	if err := n.st.Receive(now, *rep); err != nil {
		return err
	}
	n.raise(ctx, n.st.Apply())
	return nil
}

// raise writes shares that only rose; a key whose write failed is written
// again by the next Epoch (State.Resync).
func (n *Node) raise(ctx context.Context, cs []ShareChange) {
	if len(cs) == 0 {
		return
	}
	ok := n.fx.WriteShares(ctx, cs)
	n.st.Wrote(ok)
	if len(ok) == len(cs) {
		return
	}
	j := 0
	for _, c := range cs {
		if j < len(ok) && ok[j].Key == c.Key && ok[j].SharePPM == c.SharePPM {
			j++
			continue
		}
		n.st.Resync(c.Key)
	}
}
