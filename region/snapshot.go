package region

import (
	"slices"
	"time"
)

// Snapshot is a region's persistent exchange state: what the exchanging
// replica keeps in the region's store, so that a restarted region or the
// replica that takes the exchange lease over continues from it. Persist it
// after every Commit and before publishing (see State.Epoch).
//
// It holds our own counters exactly and what we had learned of gifts to us;
// peers' rows and tallies are learned again from the next reports.
type Snapshot struct {
	// Region is the region the snapshot belongs to.
	Region string
	// Regions index every row in the snapshot.
	Regions []string
	// Epoch is the last epoch number used.
	Epoch uint64
	// GenerationFloor is the highest generation the region has left for a
	// key it no longer holds: it never enters one at or below it again.
	// Losing it could make a region re-enter a generation with its row
	// forgotten, so it is persisted.
	GenerationFloor uint64
	// Heard is the epoch of the latest exchange report merged from each
	// region (indexed like Regions): the counters learned from it are in
	// the snapshot, so older reports are stale after a restart too.
	Heard []uint64
	// HeardAt is when that report was received (the receiver's clock): a
	// region not heard for IdleAfter is no longer waited for.
	HeardAt []time.Time
	// Keys are the keys with exchange state, and retired keys still
	// announcing their exit; in a partial snapshot, those of them whose
	// state changed since the snapshot saved before.
	Keys []KeySnapshot
	// Partial is true for a snapshot of what changed since the one saved
	// before (State.SnapshotChanges): Keys replace the saved keys of the
	// same name, Removed are saved keys that have no state any more, and
	// the other fields replace the saved ones. Restore takes whole
	// snapshots only (MergeSnapshot makes one).
	Partial bool
	Removed []string
}

// KeySnapshot is the persistent state of one key.
type KeySnapshot struct {
	Key string
	// Generation is the key's generation, 0 for a retired key that keeps
	// announcing Exits.
	Generation uint64
	// GenerationFloor is the highest generation the region left for this
	// key.
	GenerationFloor uint64
	// Base is the region's share when it entered Generation.
	Base int64
	// Row and Taken are the region's own rows of gifts and reclaims.
	Row, Taken []int64
	// In and InTaken are the gifts and reclaims from each region that the
	// region had applied.
	In, InTaken []int64
	// Refund and Unclaim are gifts taken back from, and reclaims given up
	// on, regions that left Generation without applying them.
	Refund, Unclaim []int64
	// Ack and AckTaken are the gifts and reclaims each region acknowledged
	// applying. An exit record is a region's last acknowledgement and is
	// not sent again once settled, so they are persisted.
	Ack, AckTaken []int64
	// Settled is the newest generation of each region's exit records the
	// region settled against.
	Settled []uint64
	// Tokens is the region's own row of tokens given with share, and
	// TokensIn the tokens each region gave it, in Generation (TokenScale
	// units); TokensWindow and TokensInWindow the fixed windows they count
	// (0 for a token bucket). Persisted before publishing, so a successor
	// never announces less than a peer saw.
	Tokens, TokensIn []int64
	TokensWindow     int64
	TokensInWindow   []int64
	// Demand is the smoothed demand of each region, in tokens per epoch.
	Demand []float64
	// Exits are the generations the region left and still announces,
	// oldest first.
	Exits []ExitSnapshot
}

// ExitSnapshot is a persisted exit record.
type ExitSnapshot struct {
	Exit
	// Refund is what the region already took back, into its base, from
	// peers that left the same generation.
	Refund []int64
	// Ack is the part of its gifts there each peer acknowledged.
	Ack []int64
	// Dropped are the reclaims not acknowledged that it gave up.
	Dropped []int64
	// At is when the generation was left; the record is announced for
	// Config.Grace after it.
	At time.Time
}

// Snapshot returns the state to persist, whole. The slices are freshly
// allocated.
func (s *State) Snapshot() Snapshot {
	snap := s.snapshotHead()
	// Size everything first: a handful of allocations, not one per row.
	n := s.n
	sz, floor := s.snapshotSize()
	// The floor saved last stays: a partial snapshot cannot lower it.
	snap.GenerationFloor = max(snap.GenerationFloor, floor, s.saved.floor)
	snap.Keys = make([]KeySnapshot, 0, sz.keys)
	b := newSnapBufs(n, sz)
	for _, ks := range s.keys {
		if persisted(ks) {
			snap.Keys = append(snap.Keys, KeySnapshot{})
			s.keySnapshot(&snap.Keys[len(snap.Keys)-1], ks, &b)
		}
	}
	return snap
}

// snapshotHead returns a snapshot without keys.
func (s *State) snapshotHead() Snapshot {
	return Snapshot{
		Region:          s.cfg.Self,
		Regions:         slices.Clone(s.cfg.Regions),
		Epoch:           s.epoch,
		GenerationFloor: s.genFloor,
		Heard:           slices.Clone(s.exchEpoch),
		HeardAt:         slices.Clone(s.exchHeard),
	}
}

// persisted reports whether a key goes in the snapshot: it has exchange state, or announces an exit.
func persisted(ks *keyState) bool {
	return ks.gen != 0 || len(ks.exits) > 0
}

// snapSize counts what a Snapshot holds: keys, rows of int64 and float64
// counters (in values), and exit records.
type snapSize struct{ keys, ints, floats, exits int }

// snapshotSize sizes the snapshot, and returns the highest floor of the keys left out of it.
func (s *State) snapshotSize() (sz snapSize, floor uint64) {
	n := s.n
	for _, ks := range s.keys {
		if !persisted(ks) {
			// Not persisted; its floor must be, or a restarted region
			// could enter again a generation it left.
			floor = max(floor, ks.floor)
			continue
		}
		sz.add(n, ks)
	}
	return sz, floor
}

// add counts what the snapshot of a persisted key holds.
func (sz *snapSize) add(n int, ks *keyState) {
	sz.keys++
	if ks.gen != 0 {
		sz.ints += 11 * n
		sz.floats += n
	}
	sz.exits += len(ks.exits)
	sz.ints += 7 * n * len(ks.exits)
}

// snapBufs are the allocations a Snapshot's slices are carved from.
type snapBufs struct {
	rows   rowSlab
	floats []float64
	gens   []uint64
	exits  []ExitSnapshot
}

// newSnapBufs makes the allocations for a snapshot of size sz.
func newSnapBufs(n int, sz snapSize) snapBufs {
	return snapBufs{
		rows:   rowSlab{buf: make([]int64, sz.ints), n: n},
		floats: make([]float64, sz.floats),
		gens:   make([]uint64, sz.keys*n),
		exits:  make([]ExitSnapshot, 0, sz.exits),
	}
}

// keySnapshot fills k, the persistent state of a key, its slices carved from b.
func (s *State) keySnapshot(k *KeySnapshot, ks *keyState, b *snapBufs) {
	n := s.n
	k.Key, k.Generation, k.GenerationFloor, k.Settled = ks.key, ks.gen, ks.floor, b.gens[:n:n]
	b.gens = b.gens[n:]
	copy(k.Settled, ks.settled())
	if ks.gen != 0 {
		r := &b.rows
		k.Base = ks.base
		k.Row, k.Taken = r.take(s.ownRow(ks)), r.take(s.ownTaken(ks))
		k.In, k.InTaken = r.take(ks.in()), r.take(ks.inTaken())
		k.Refund, k.Unclaim = r.take(ks.refund()), r.take(ks.unclaim())
		k.Ack, k.AckTaken = r.take(ks.ack()), r.take(ks.ackTkn())
		k.Tokens, k.TokensIn, k.TokensWindow, k.TokensInWindow = r.take(ks.tok()), r.take(ks.tokIn()), ks.tokWin, r.take(ks.tokInWin())
		k.Demand = b.floats[:n:n]
		b.floats = b.floats[n:]
		copy(k.Demand, ks.ewma())
	}
	if len(ks.exits) > 0 {
		k.Exits = b.exitSnapshots(ks.exits)
	}
}

// exitSnapshots returns the persisted exit records of a key, carved from b.
func (b *snapBufs) exitSnapshots(exits []*exitState) []ExitSnapshot {
	r := &b.rows
	start := len(b.exits)
	for _, x := range exits {
		b.exits = append(b.exits, ExitSnapshot{
			Exit: Exit{Generation: x.gen, Row: r.take(x.row), Taken: r.take(x.taken),
				In: r.take(x.in), InTaken: r.take(x.intake)},
			Refund:  r.take(x.refund),
			Ack:     r.take(x.ack),
			Dropped: r.take(x.dropped),
			At:      x.at,
		})
	}
	return b.exits[start:len(b.exits):len(b.exits)]
}
