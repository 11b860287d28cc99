package region

import (
	"slices"
	"strings"
)

// This file holds incremental persistence (docs/DESIGN.md, "Keys at rest"):
// once a snapshot was saved, the next lists only the keys whose state may
// have changed since, which with keys at rest are those an Epoch visited.

// saveState is what the State knows of its persisted snapshot.
type saveState struct {
	// ok: a snapshot was saved since New, Restore or a failed save, so the
	// next may be partial.
	ok bool
	// floor is the GenerationFloor saved last.
	floor uint64
	// unsaved are the keys whose record may differ from the saved one
	// (keyState.unsaved), removed the keys saved and dropped since.
	unsaved []*keyState
	removed []string
}

// markUnsaved notes that ks's persisted record may have changed.
func (s *State) markUnsaved(ks *keyState) {
	if !ks.unsaved {
		ks.unsaved = true
		s.saved.unsaved = append(s.saved.unsaved, ks)
	}
}

// SnapshotChanges returns the state to persist, as Snapshot does, but once a
// snapshot was saved (Saved) it is partial: Keys are the keys whose state
// changed since, Removed those that have none any more. After New, Restore
// or SaveFailed it is whole. Call Saved once it is persisted, SaveFailed
// when that failed (the next is then whole, whatever the store applied).
func (s *State) SnapshotChanges() Snapshot {
	if !s.saved.ok {
		return s.Snapshot()
	}
	snap := s.snapshotHead()
	snap.Partial = true
	floor := max(s.saved.floor, s.genFloor)
	var sz snapSize
	for _, ks := range s.saved.unsaved {
		if s.holds(ks) && persisted(ks) {
			sz.add(s.n, ks)
		}
	}
	b := newSnapBufs(s.n, sz)
	snap.Keys = make([]KeySnapshot, 0, sz.keys)
	for _, ks := range s.saved.unsaved {
		switch {
		case !s.holds(ks): // dropped: in removed if it was saved
		case persisted(ks):
			snap.Keys = append(snap.Keys, KeySnapshot{})
			s.keySnapshot(&snap.Keys[len(snap.Keys)-1], ks, &b)
		default:
			floor = max(floor, ks.floor)
			if ks.inStore {
				snap.Removed = append(snap.Removed, ks.key)
			}
		}
	}
	for _, key := range s.saved.removed {
		if ks := s.byKey[key]; ks == nil || !persisted(ks) || !ks.unsaved {
			snap.Removed = append(snap.Removed, key)
		}
	}
	snap.GenerationFloor = floor
	return snap
}

// Saved records that the snapshot SnapshotChanges returned last is
// persisted: the next lists what changes from now on.
func (s *State) Saved() {
	if !s.saved.ok {
		for _, ks := range s.keys {
			ks.inStore = persisted(ks)
			ks.unsaved = false
		}
		_, s.saved.floor = s.snapshotSize()
		s.saved.floor = max(s.saved.floor, s.genFloor)
	} else {
		for _, ks := range s.saved.unsaved {
			ks.unsaved = false
			if s.holds(ks) {
				ks.inStore = persisted(ks)
				if !ks.inStore {
					s.saved.floor = max(s.saved.floor, ks.floor)
				}
			}
		}
		s.saved.floor = max(s.saved.floor, s.genFloor)
	}
	clear(s.saved.unsaved)
	s.saved.unsaved = s.saved.unsaved[:0]
	s.saved.removed = s.saved.removed[:0]
	s.saved.ok = true
}

// SaveFailed records that persisting the latest snapshot failed: the next
// SnapshotChanges is whole.
func (s *State) SaveFailed() {
	s.saved.ok = false
	for _, ks := range s.saved.unsaved {
		ks.unsaved = false
	}
	clear(s.saved.unsaved)
	s.saved.unsaved = s.saved.unsaved[:0]
	s.saved.removed = s.saved.removed[:0]
}

// MergeSnapshot returns base with the partial snapshot d applied (d itself
// when it is whole): what a store keeping whole snapshots holds after saving
// d. base is not modified.
func MergeSnapshot(base *Snapshot, d *Snapshot) *Snapshot {
	if !d.Partial || base == nil {
		out := *d
		out.Partial, out.Removed = false, nil
		return &out
	}
	out := *d
	out.Partial, out.Removed = false, nil
	gone := make(map[string]bool, len(d.Removed)+len(d.Keys))
	for _, k := range d.Removed {
		gone[k] = true
	}
	for i := range d.Keys {
		gone[d.Keys[i].Key] = true
	}
	out.Keys = make([]KeySnapshot, 0, len(base.Keys)+len(d.Keys))
	for _, k := range base.Keys {
		if !gone[k.Key] {
			out.Keys = append(out.Keys, k)
		}
	}
	out.Keys = append(out.Keys, d.Keys...)
	slices.SortFunc(out.Keys, func(a, b KeySnapshot) int { return strings.Compare(a.Key, b.Key) })
	return &out
}
