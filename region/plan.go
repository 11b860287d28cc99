package region

import (
	"fmt"
	"slices"
	"time"
)

// This file holds the outbox of an epoch and the calls that carry it out:
// Epoch builds a Plan, Commit records it once its Lower writes are done, and
// Apply raises shares as gifts arrive in between epochs.

// Plan is the outbox of one Epoch: the store writes the caller must carry
// out, in the order documented on State.Epoch.
type Plan struct {
	// Epoch is the epoch number the plan belongs to.
	Epoch uint64
	// Lower are shares to write to the store BEFORE Commit: each is at or
	// below the share the store may hold, and this epoch's gifts are
	// already taken out of it. Remove the entries whose write was not
	// confirmed before calling Commit; their keys give nothing this epoch.
	// Set each entry's Released to what its write released: those tokens
	// go with the gifts.
	Lower []ShareChange
	// Raise are shares to write after Commit (gifts received, or our gifts
	// outweighed by those received). Their outcome never matters for
	// safety; call Resync for a key whose write failed.
	Raise []ShareChange
	// Retire are keys whose exchange state was dropped at rest: delete
	// their stored share after Commit, so the bucket falls back to the
	// region's initial share.
	Retire []string

	seq   uint64
	steps []step
}

// ShareChange sets the applied share of Key in this region's store, and
// carries the tokens escrowed with share (TokenScale units).
type ShareChange struct {
	Key      string
	SharePPM int64
	// Received is Σ of the tokens peers gave this region for Key in the
	// key's exchange generation Gen: the store credits the part it has not
	// credited for Gen yet (once, whatever duplicates), capped at the
	// bucket's capacity. Gen 0 carries no tokens.
	Gen      uint64
	Received int64
	// Window is, for a fixed-window key, the window (its start in Unix µs)
	// whose tokens Received counts: each window's tokens are its own.
	Window int64
	// Released and ReleasedWindow are set by Effects.WriteShares: the
	// tokens the write took out of the bucket because they were above its
	// new capacity, and the fixed window they belong to (0 for a token
	// bucket). The region gives them with this epoch's gifts of share.
	Released, ReleasedWindow int64

	step int32 // 1 + index in Plan.steps
}

// step is one key's part of a plan: the new applied share and the gifts and
// reclaims to record at Commit.
type step struct {
	ks      *keyState
	gen     uint64
	applied int64
	gifts   []int64 // nil: none
	takes   []int64 // nil: none
	intake  []int64 // inTaken when planned, to acknowledge at Commit (nil: unchanged)
	entry   int8    // 0 none, 1 Lower, 2 Raise
	// released is what the Lower write took out of the bucket, in the
	// fixed window releasedWin, given with the gifts at Commit.
	released, releasedWin int64
}

// Epoch runs one sync step for every active key at now (DESIGN.md, "Each
// epoch", steps 2 to 5, on the reports received so far) and returns what to
// write. It closes the local tallies of the epoch, updates the demand EWMA,
// moves keys to the newest generation, retires keys at rest, and decides
// gifts and reclaims. Gifts are not given until Commit.
//
// Node.Decide carries the plan out in the order safety needs (write Lower,
// Commit, persist the Snapshot, publish the Report, write Raise, delete
// Retire); docs/DESIGN.md, "The protocol's order", says why. A plan that is
// not committed gives nothing: the next Epoch recomputes, and rewrites the
// shares of the keys it touched before any gift.
func (s *State) Epoch(now time.Time) Plan {
	if s.tallied {
		s.now = now // the second phase: Tally numbered the epoch
	} else {
		s.advance(now)
	}
	if !s.committed {
		for _, st := range s.open {
			st.ks.applied = -1 // the Lower write may or may not have happened
			s.touch(st.ks)
		}
	}
	s.pruneReplicas(now)
	s.agree(now)
	s.seq++
	s.committed = false
	p := Plan{Epoch: s.epoch, seq: s.seq}
	s.epochKeys(now, &p)
	s.sizes.steps, s.sizes.lower, s.sizes.raise = len(p.steps), len(p.Lower), len(p.Raise)
	if !s.tallied {
		s.closeTallies() // one phase: epochKey closed every key's
	}
	s.prevNow = now
	s.open = p.steps
	s.restored, s.tallied = false, false
	return p
}

// advance moves the clock and the epoch number.
func (s *State) advance(now time.Time) {
	s.now = now
	e := uint64(0)
	if ns := now.UnixNano(); ns > 0 {
		e = uint64(ns / int64(s.cfg.Period))
	}
	s.epoch = max(s.epoch+1, e)
}

// rowBuf returns a new row for a plan's step, a copy of v (zero when v is
// nil), carved from a larger allocation so that a plan moving many keys
// allocates a few slabs rather than a row per key.
func (s *State) rowBuf(v []int64) []int64 {
	if len(s.slab) < s.n {
		s.slab = make([]int64, max(1024, 64*s.n))
	}
	row := s.slab[:s.n:s.n]
	s.slab = s.slab[s.n:]
	if v == nil {
		clear(row)
	} else {
		copy(row, v)
	}
	return row
}

// Commit records the gifts and reclaims of p in our rows and its shares as
// applied, once the caller has written p.Lower (see Epoch). Entries removed
// from p.Lower give nothing and leave the key's applied share unknown, so
// the next Epoch writes it again. It returns ErrStalePlan for a plan that is
// not the latest or was committed already, and ErrInvalidPlan for entries
// that Epoch did not produce; then nothing is recorded.
func (s *State) Commit(p Plan) error {
	if p.seq == 0 || p.seq != s.seq || s.committed {
		return fmt.Errorf("%w: plan %d, latest %d", ErrStalePlan, p.seq, s.seq)
	}
	if cap(s.kept) < len(p.steps) {
		s.kept = make([]bool, len(p.steps))
	}
	kept := s.kept[:len(p.steps)]
	clear(kept)
	for _, list := range []struct {
		cs    []ShareChange
		entry int8
	}{{p.Lower, 1}, {p.Raise, 2}} {
		for _, c := range list.cs {
			i := int(c.step) - 1
			if i < 0 || i >= len(p.steps) || p.steps[i].entry != list.entry || p.steps[i].ks.key != c.Key || p.steps[i].applied != c.SharePPM {
				return fmt.Errorf("%w: entry %q=%d", ErrInvalidPlan, c.Key, c.SharePPM)
			}
			kept[i] = true
			if list.entry == 1 {
				p.steps[i].released, p.steps[i].releasedWin = c.Released, c.ReleasedWindow
			}
		}
	}
	for i := range p.steps {
		st := &p.steps[i]
		ks := st.ks
		if st.entry == 1 && !kept[i] {
			ks.applied = -1 // the write may have happened; gifts wait
			continue
		}
		if ks.gen != st.gen || !s.holds(ks) {
			continue // cannot happen between Epoch and Commit; stay safe
		}
		row, tk := s.ownRow(ks), s.ownTaken(ks)
		for k := range row {
			if st.gifts != nil {
				row[k] += st.gifts[k]
			}
			if st.takes != nil {
				tk[k] += st.takes[k]
			}
		}
		if st.gifts != nil && st.released > 0 {
			s.giveTokens(ks, st.gifts, st.released, st.releasedWin)
		}
		if st.gifts != nil || st.takes != nil {
			ks.lastTransfer = s.now
		}
		if st.entry != 2 || kept[i] {
			ks.applied = st.applied
		}
		if st.intake != nil {
			copy(ks.inTakenStored(), st.intake)
		}
	}
	s.committed = true
	return nil
}

// Apply returns the keys whose share rose since it was last written, because
// peers' gifts (or refunds) arrived, or to which peers gave tokens, with the
// share to write: DESIGN.md "Each epoch", step 5, done on receipt rather
// than at the next epoch, so that a gift is in use a network delay after it
// was given. Call it after
// Receive and write the changes; a write that fails needs Resync. Raising
// is always safe (our computed share is never above our true share), so the
// order of these writes does not matter.
//
// It returns nothing between an Epoch and its Commit (the plan's Lower
// writes decide the stored shares then), for a key whose stored share is
// unknown (the next Epoch writes it), and for a key with a reclaim on us not
// yet written (the next Epoch lowers it).
func (s *State) Apply() []ShareChange {
	if !s.committed {
		return nil // keep the list for after the Commit
	}
	var out []ShareChange
	for _, ks := range s.toApply {
		ks.toApply = false
		s.touch(ks)
		if !s.holds(ks) || ks.gen == 0 || ks.applied < 0 || !slices.Equal(ks.inTaken(), ks.inTakenStored()) {
			continue
		}
		a := clamp(s.own(ks), 0, PPM)
		if a > ks.applied || ks.creditPending() {
			// Tokens come with gifts of share; a write for tokens alone
			// (its share written already) writes the share it holds.
			ks.applied = max(ks.applied, a)
			if out == nil {
				out = make([]ShareChange, 0, len(s.toApply))
			}
			out = append(out, ks.change(ks.applied))
		}
	}
	clear(s.toApply)
	s.toApply = s.toApply[:0]
	return out
}
