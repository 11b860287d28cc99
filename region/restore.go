package region

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Restore replaces the exchange state with snap, which may come from a
// configuration with another region set: counters of a region no longer
// configured are folded into the base, which keeps every share unchanged
// (see "Region set changes" in the package documentation). Local tallies not
// yet published are kept. Every restored key's stored share counts as
// unknown, so the next Epoch writes them all before any gift. An invalid
// snapshot (ErrMalformed, or ErrUnknownRegion when it is another region's)
// changes nothing.
func (s *State) Restore(snap Snapshot) error {
	if err := s.checkSnapshot(&snap); err != nil {
		return err
	}

	// Valid: build the new key set, then swap it in.
	cols := s.columns(snap.Regions)
	old := s.keys
	s.keys, s.meta, s.byKey, s.buckets = nil, nil, make(map[string]*keyState, len(snap.Keys)), nil
	for i := range snap.Keys {
		s.restoreKey(&snap.Keys[i], cols)
	}
	s.keepTallies(old)
	s.restoreHeard(&snap, cols)
	copy(s.exchSince, s.exchEpoch) // no listing of a peer stands yet
	clear(s.exchRefresh)
	s.restartStreams()
	for _, ks := range s.keys {
		copy(ks.born(), s.exchEpoch) // we know nothing of the peers' state yet
	}
	s.epoch = max(s.epoch, snap.Epoch)
	s.genFloor = max(s.genFloor, snap.GenerationFloor)
	s.seq++
	s.committed, s.open = true, nil
	s.restored = true
	s.SaveFailed() // the next snapshot is whole
	return nil
}

// badSnapshot is the error for a malformed snapshot of region.
func badSnapshot(region, format string, args ...any) error {
	return fmt.Errorf("%w: snapshot of %q: %s", ErrMalformed, region, fmt.Sprintf(format, args...))
}

// checkSnapshot decides whether snap can be restored here: this region's, and well formed.
func (s *State) checkSnapshot(snap *Snapshot) error {
	if snap.Partial || len(snap.Removed) > 0 {
		return badSnapshot(snap.Region, "a partial snapshot: merge it into the one it changes first")
	}
	if snap.Region != s.cfg.Self {
		return fmt.Errorf("%w: snapshot of %q restored in %q", ErrUnknownRegion, snap.Region, s.cfg.Self)
	}
	for i, r := range snap.Regions {
		if r == "" || (i > 0 && snap.Regions[i-1] >= r) {
			return badSnapshot(snap.Region, "Regions not sorted without duplicates at %d", i)
		}
	}
	if !slices.Contains(snap.Regions, s.cfg.Self) {
		return badSnapshot(snap.Region, "Regions %v do not include %q", snap.Regions, s.cfg.Self)
	}
	m := len(snap.Regions)
	if len(snap.Heard) != m || len(snap.HeardAt) != m {
		return badSnapshot(snap.Region, "Heard has %d and HeardAt %d columns, want %d", len(snap.Heard), len(snap.HeardAt), m)
	}
	seen := make(map[string]bool, len(snap.Keys))
	for i := range snap.Keys {
		k := &snap.Keys[i]
		if k.Key == "" || seen[k.Key] {
			return badSnapshot(snap.Region, "key %d: empty or duplicate name %q", i, k.Key)
		}
		seen[k.Key] = true
		if err := checkKeySnapshot(snap.Region, k, m); err != nil {
			return err
		}
	}
	return nil
}

// checkKeySnapshot decides whether one key of a snapshot with m columns is well formed.
func checkKeySnapshot(region string, k *KeySnapshot, m int) error {
	if len(k.Settled) != m {
		return badSnapshot(region, "key %q: Settled has %d columns, want %d", k.Key, len(k.Settled), m)
	}
	if k.Generation != 0 {
		if err := checkKeyCounters(region, k, m); err != nil {
			return err
		}
	} else if len(k.Exits) == 0 {
		return badSnapshot(region, "key %q: no generation and no exit", k.Key)
	}
	return checkExitSnapshots(region, k, m)
}

// checkKeyCounters decides whether a key's counters, smoothed demand and base are in range.
func checkKeyCounters(region string, k *KeySnapshot, m int) error {
	for _, v := range []struct {
		what string
		row  []int64
	}{{"Row", k.Row}, {"Taken", k.Taken}, {"In", k.In}, {"InTaken", k.InTaken}, {"Refund", k.Refund}, {"Unclaim", k.Unclaim}, {"Ack", k.Ack}, {"AckTaken", k.AckTaken}} {
		if err := checkCounters(region, k.Key, v.what, v.row, m); err != nil {
			return err
		}
	}
	// The token rows came later: a snapshot without them holds none.
	for _, v := range []struct {
		what string
		row  []int64
	}{{"Tokens", k.Tokens}, {"TokensIn", k.TokensIn}, {"TokensInWindow", k.TokensInWindow}} {
		if len(v.row) != 0 {
			if err := checkCounters(region, k.Key, v.what, v.row, m); err != nil {
				return err
			}
		}
	}
	if len(k.Demand) != m {
		return badSnapshot(region, "key %q: Demand has %d columns, want %d", k.Key, len(k.Demand), m)
	}
	for _, d := range k.Demand {
		if !(d >= 0) || math.IsInf(d, 0) {
			return badSnapshot(region, "key %q: Demand %v", k.Key, d)
		}
	}
	if k.Base < -PPM || k.Base > PPM {
		return badSnapshot(region, "key %q: Base %d", k.Key, k.Base)
	}
	return nil
}

// checkExitSnapshots decides whether a key's exit records are in order and in range.
func checkExitSnapshots(region string, k *KeySnapshot, m int) error {
	for e := range k.Exits {
		x := &k.Exits[e]
		if x.Generation == 0 || (k.Generation != 0 && x.Generation >= k.Generation) || (e > 0 && x.Generation <= k.Exits[e-1].Generation) {
			return badSnapshot(region, "key %q: exit of generation %d, current %d", k.Key, x.Generation, k.Generation)
		}
		for _, v := range []struct {
			what string
			row  []int64
		}{{"Exit.Row", x.Row}, {"Exit.Taken", x.Taken}, {"Exit.In", x.In}, {"Exit.InTaken", x.InTaken}, {"Exit.Refund", x.Refund}, {"Exit.Ack", x.Ack}, {"Exit.Dropped", x.Dropped}} {
			if err := checkCounters(region, k.Key, v.what, v.row, m); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkCounters decides whether a row of counters has m columns, each in [0, maxCounter].
func checkCounters(region, key, what string, v []int64, m int) error {
	if len(v) != m {
		return badSnapshot(region, "key %q: %s has %d columns, want %d", key, what, len(v), m)
	}
	for _, x := range v {
		if x < 0 || x > maxCounter {
			return badSnapshot(region, "key %q: %s value %d out of range", key, what, x)
		}
	}
	return nil
}

// restoreKey adds a key of a valid snapshot, its columns mapped by cols (-1: a region gone).
func (s *State) restoreKey(k *KeySnapshot, cols []int) {
	ks := s.addKey(k.Key)
	ks.created, ks.lastDemand, ks.lastTransfer = time.Time{}, time.Time{}, time.Time{}
	ks.gen, ks.floor = k.Generation, k.GenerationFloor
	for c, j := range cols {
		if j >= 0 {
			ks.settled()[j] = k.Settled[c]
		}
	}
	if k.Generation != 0 {
		s.restoreCounters(ks, k, cols)
	}
	for e := range k.Exits {
		ks.exits = append(ks.exits, restoreExit(&k.Exits[e], cols, s.n))
	}
}

// restoreCounters restores the base, rows and smoothed demand of a key in a generation.
func (s *State) restoreCounters(ks *keyState, k *KeySnapshot, cols []int) {
	ks.base, ks.tokWin = k.Base, k.TokensWindow
	row, tk := s.ownRow(ks), s.ownTaken(ks)
	for c, j := range cols {
		if j < 0 {
			// A region no longer configured: keep the share
			// its counters stand for in the base.
			ks.base += k.In[c] - k.Row[c] + k.Taken[c] - k.InTaken[c] + k.Refund[c] - k.Unclaim[c]
			continue
		}
		row[j], tk[j] = k.Row[c], k.Taken[c]
		ks.in()[j], ks.inTaken()[j] = k.In[c], k.InTaken[c]
		ks.tok()[j], ks.tokIn()[j], ks.tokInWin()[j] = tokensAt(k.Tokens, c), tokensAt(k.TokensIn, c), tokensAt(k.TokensInWindow, c)
		ks.refund()[j], ks.unclaim()[j] = k.Refund[c], k.Unclaim[c]
		ks.ack()[j], ks.ackTkn()[j] = k.Ack[c], k.AckTaken[c]
		ks.ewma()[j] = k.Demand[c]
	}
	ks.base = clamp(ks.base, -PPM, PPM)
	ks.rowGen()[s.self], ks.bases()[s.self] = k.Generation, ks.base
}

// restoreExit returns a snapshot's exit record for n regions, its columns mapped by cols.
func restoreExit(x *ExitSnapshot, cols []int, n int) *exitState {
	p := &exitState{gen: x.Generation, at: x.At}
	p.alloc(n)
	for c, j := range cols {
		if j >= 0 {
			p.row[j], p.taken[j], p.in[j], p.intake[j] = x.Row[c], x.Taken[c], x.In[c], x.InTaken[c]
			p.refund[j], p.ack[j], p.dropped[j] = x.Refund[c], x.Ack[c], x.Dropped[c]
		}
	}
	return p
}

// keepTallies carries the local tallies not yet published over from old, the key set Restore replaced.
func (s *State) keepTallies(old []*keyState) {
	for _, o := range old {
		cur := s.cur(o)
		if cur == (tally{}) {
			continue
		}
		ks := s.byKey[o.key]
		if ks == nil {
			ks = s.addKey(o.key)
		}
		ks.cur0, ks.curAt = cur, s.tallyGen
	}
}

// restoreHeard raises when each region was last heard to the snapshot's: older reports stay stale.
func (s *State) restoreHeard(snap *Snapshot, cols []int) {
	for c, j := range cols {
		if j >= 0 {
			s.exchEpoch[j] = max(s.exchEpoch[j], snap.Heard[c])
			if snap.HeardAt[c].After(s.exchHeard[j]) {
				s.exchHeard[j] = snap.HeardAt[c]
			}
		}
	}
}
