package region

import (
	"fmt"
	"math"
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
	// announcing their exit.
	Keys []KeySnapshot
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

// Snapshot returns the state to persist. The slices are freshly allocated.
func (s *State) Snapshot() Snapshot {
	snap := Snapshot{
		Region:          s.cfg.Self,
		Regions:         slices.Clone(s.cfg.Regions),
		Epoch:           s.epoch,
		GenerationFloor: s.genFloor,
		Heard:           slices.Clone(s.exchEpoch),
		HeardAt:         slices.Clone(s.exchHeard),
	}
	// Size everything first: a handful of allocations, not one per row.
	n := s.n
	var keys, ints, floats, exits int
	for _, ks := range s.keys {
		if ks.gen == 0 && len(ks.exits) == 0 {
			// Not persisted; its floor must be, or a restarted region
			// could enter again a generation it left.
			snap.GenerationFloor = max(snap.GenerationFloor, ks.floor)
			continue
		}
		keys++
		if ks.gen != 0 {
			ints += 8 * n
			floats += n
		}
		exits += len(ks.exits)
		ints += 7 * n * len(ks.exits)
	}
	snap.Keys = make([]KeySnapshot, 0, keys)
	buf := make([]int64, ints)
	fbuf := make([]float64, floats)
	gbuf := make([]uint64, keys*n)
	xbuf := make([]ExitSnapshot, 0, exits)
	take := func(v []int64) []int64 {
		out := buf[:n:n]
		buf = buf[n:]
		copy(out, v)
		return out
	}
	for _, ks := range s.keys {
		if ks.gen == 0 && len(ks.exits) == 0 {
			continue
		}
		k := KeySnapshot{Key: ks.key, Generation: ks.gen, GenerationFloor: ks.floor, Settled: gbuf[:n:n]}
		gbuf = gbuf[n:]
		copy(k.Settled, ks.settled)
		if ks.gen != 0 {
			k.Base = ks.base
			k.Row, k.Taken = take(s.ownRow(ks)), take(s.ownTaken(ks))
			k.In, k.InTaken = take(ks.in), take(ks.inTaken)
			k.Refund, k.Unclaim = take(ks.refund), take(ks.unclaim)
			k.Ack, k.AckTaken = take(ks.ack), take(ks.ackTkn)
			k.Demand = fbuf[:n:n]
			fbuf = fbuf[n:]
			copy(k.Demand, ks.ewma)
		}
		if len(ks.exits) > 0 {
			start := len(xbuf)
			for _, x := range ks.exits {
				xbuf = append(xbuf, ExitSnapshot{
					Exit: Exit{Generation: x.gen, Row: take(x.row), Taken: take(x.taken),
						In: take(x.in), InTaken: take(x.intake)},
					Refund:  take(x.refund),
					Ack:     take(x.ack),
					Dropped: take(x.dropped),
					At:      x.at,
				})
			}
			k.Exits = xbuf[start:len(xbuf):len(xbuf)]
		}
		snap.Keys = append(snap.Keys, k)
	}
	return snap
}

// Restore replaces the exchange state with snap, which may come from a
// configuration with another region set: counters of a region no longer
// configured are folded into the base, which keeps every share unchanged
// (see "Region set changes" in the package documentation). Local tallies not
// yet published are kept. Every restored key's stored share counts as
// unknown, so the next Epoch writes them all before any gift. An invalid
// snapshot (ErrMalformed, or ErrUnknownRegion when it is another region's)
// changes nothing.
func (s *State) Restore(snap Snapshot) error {
	if snap.Region != s.cfg.Self {
		return fmt.Errorf("%w: snapshot of %q restored in %q", ErrUnknownRegion, snap.Region, s.cfg.Self)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: snapshot of %q: %s", ErrMalformed, snap.Region, fmt.Sprintf(format, args...))
	}
	for i, r := range snap.Regions {
		if r == "" || (i > 0 && snap.Regions[i-1] >= r) {
			return bad("Regions not sorted without duplicates at %d", i)
		}
	}
	if !slices.Contains(snap.Regions, s.cfg.Self) {
		return bad("Regions %v do not include %q", snap.Regions, s.cfg.Self)
	}
	cols := s.columns(snap.Regions)
	m := len(snap.Regions)
	if len(snap.Heard) != m || len(snap.HeardAt) != m {
		return bad("Heard has %d and HeardAt %d columns, want %d", len(snap.Heard), len(snap.HeardAt), m)
	}
	vec := func(key, what string, v []int64, allowNeg bool) error {
		if len(v) != m {
			return bad("key %q: %s has %d columns, want %d", key, what, len(v), m)
		}
		for _, x := range v {
			if (x < 0 && !allowNeg) || x > maxCounter || x < -maxCounter {
				return bad("key %q: %s value %d out of range", key, what, x)
			}
		}
		return nil
	}
	seen := make(map[string]bool, len(snap.Keys))
	for i := range snap.Keys {
		k := &snap.Keys[i]
		if k.Key == "" || seen[k.Key] {
			return bad("key %d: empty or duplicate name %q", i, k.Key)
		}
		if len(k.Settled) != m {
			return bad("key %q: Settled has %d columns, want %d", k.Key, len(k.Settled), m)
		}
		seen[k.Key] = true
		if k.Generation != 0 {
			for _, v := range []struct {
				what string
				row  []int64
			}{{"Row", k.Row}, {"Taken", k.Taken}, {"In", k.In}, {"InTaken", k.InTaken}, {"Refund", k.Refund}, {"Unclaim", k.Unclaim}, {"Ack", k.Ack}, {"AckTaken", k.AckTaken}} {
				if err := vec(k.Key, v.what, v.row, false); err != nil {
					return err
				}
			}
			if len(k.Demand) != m {
				return bad("key %q: Demand has %d columns, want %d", k.Key, len(k.Demand), m)
			}
			for _, d := range k.Demand {
				if !(d >= 0) || math.IsInf(d, 0) {
					return bad("key %q: Demand %v", k.Key, d)
				}
			}
			if k.Base < -PPM || k.Base > PPM {
				return bad("key %q: Base %d", k.Key, k.Base)
			}
		} else if len(k.Exits) == 0 {
			return bad("key %q: no generation and no exit", k.Key)
		}
		for e := range k.Exits {
			x := &k.Exits[e]
			if x.Generation == 0 || (k.Generation != 0 && x.Generation >= k.Generation) || (e > 0 && x.Generation <= k.Exits[e-1].Generation) {
				return bad("key %q: exit of generation %d, current %d", k.Key, x.Generation, k.Generation)
			}
			for _, v := range []struct {
				what string
				row  []int64
			}{{"Exit.Row", x.Row}, {"Exit.Taken", x.Taken}, {"Exit.In", x.In}, {"Exit.InTaken", x.InTaken}, {"Exit.Refund", x.Refund}, {"Exit.Ack", x.Ack}, {"Exit.Dropped", x.Dropped}} {
				if err := vec(k.Key, v.what, v.row, false); err != nil {
					return err
				}
			}
		}
	}

	// Valid: build the new key set, then swap it in.
	old := s.keys
	s.keys, s.byKey = nil, make(map[string]*keyState, len(snap.Keys))
	me := s.self
	for i := range snap.Keys {
		k := &snap.Keys[i]
		ks := s.addKey(k.Key)
		ks.created, ks.lastDemand, ks.lastTransfer = time.Time{}, time.Time{}, time.Time{}
		ks.gen, ks.floor = k.Generation, k.GenerationFloor
		for c, j := range cols {
			if j >= 0 {
				ks.settled[j] = k.Settled[c]
			}
		}
		if k.Generation != 0 {
			ks.base = k.Base
			row, tk := s.ownRow(ks), s.ownTaken(ks)
			for c, j := range cols {
				if j < 0 {
					// A region no longer configured: keep the share
					// its counters stand for in the base.
					ks.base += k.In[c] - k.Row[c] + k.Taken[c] - k.InTaken[c] + k.Refund[c] - k.Unclaim[c]
					continue
				}
				row[j], tk[j] = k.Row[c], k.Taken[c]
				ks.in[j], ks.inTaken[j] = k.In[c], k.InTaken[c]
				ks.refund[j], ks.unclaim[j] = k.Refund[c], k.Unclaim[c]
				ks.ack[j], ks.ackTkn[j] = k.Ack[c], k.AckTaken[c]
				ks.ewma[j] = k.Demand[c]
			}
			ks.base = clamp(ks.base, -PPM, PPM)
			ks.rowGen[me], ks.bases[me] = k.Generation, ks.base
		}
		for e := range k.Exits {
			x := &k.Exits[e]
			p := &exitState{gen: x.Generation, at: x.At}
			p.alloc(s.n)
			for c, j := range cols {
				if j >= 0 {
					p.row[j], p.taken[j], p.in[j], p.intake[j] = x.Row[c], x.Taken[c], x.In[c], x.InTaken[c]
					p.refund[j], p.ack[j], p.dropped[j] = x.Refund[c], x.Ack[c], x.Dropped[c]
				}
			}
			ks.exits = append(ks.exits, p)
		}
	}
	for _, o := range old {
		if o.cur0 == (tally{}) {
			continue
		}
		ks := s.byKey[o.key]
		if ks == nil {
			ks = s.addKey(o.key)
		}
		ks.cur0 = o.cur0
	}
	for c, j := range cols {
		if j >= 0 {
			s.exchEpoch[j] = max(s.exchEpoch[j], snap.Heard[c])
			if snap.HeardAt[c].After(s.exchHeard[j]) {
				s.exchHeard[j] = snap.HeardAt[c]
			}
		}
	}
	for _, ks := range s.keys {
		copy(ks.born, s.exchEpoch) // we know nothing of the peers' state yet
	}
	s.epoch = max(s.epoch, snap.Epoch)
	s.genFloor = max(s.genFloor, snap.GenerationFloor)
	s.seq++
	s.committed, s.open = true, nil
	s.restored = true
	return nil
}
