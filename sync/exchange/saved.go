package exchange

import (
	"hash/maphash"
)

// savedRecords is what the holder knows its Coordinator stores: a hash of
// each key's record, from the state it loaded at its take-over and the
// saves confirmed since. The Node asks for a whole save after every failed
// one, and a whole save of 100,000 records is seconds of Lua on a loaded
// Redis, during which the hold cannot be renewed; it failed on its deadline
// (the script runs on), and the next save was whole again, every epoch
// (issue 12). With the hashes, the holder saves the records that differ
// from the stored ones instead: the same stored state, at the size of a
// partial save.
type savedRecords struct {
	ok   bool // the hashes are those of the stored state
	seed maphash.Seed
	hash map[string]uint64 // 0: unknown (a failed save may have written it)
}

func (s *savedRecords) sum(rec []byte) uint64 {
	h := maphash.Bytes(s.seed, rec)
	if h == 0 {
		h = 1
	}
	return h
}

// forget makes the stored state unknown: the next save is whole.
func (s *savedRecords) forget() {
	s.ok = false
	s.hash = nil
}

// loaded notes the state the Coordinator returned.
func (s *savedRecords) loaded(st SavedState) {
	if st.Head == nil {
		s.forget()
		return
	}
	s.hash = make(map[string]uint64, len(st.Keys))
	for i, k := range st.Keys {
		s.hash[k] = s.sum(st.Records[i])
	}
	s.ok = true
}

// saved notes a save that was confirmed.
func (s *savedRecords) saved(st SavedState) {
	if st.Whole {
		s.hash = make(map[string]uint64, len(st.Keys))
		s.ok = true
	}
	if !s.ok {
		return
	}
	for _, k := range st.Deleted {
		delete(s.hash, k)
	}
	for i, k := range st.Keys {
		s.hash[k] = s.sum(st.Records[i])
	}
}

// failed notes a save that failed: it may have been applied or not.
func (s *savedRecords) failed(st SavedState) {
	if st.Whole || !s.ok {
		s.forget()
		return
	}
	for _, k := range st.Deleted {
		s.hash[k] = 0
	}
	for _, k := range st.Keys {
		s.hash[k] = 0
	}
}

// partial returns the whole state st as the changes to the stored state,
// and false when that is unknown.
func (s *savedRecords) partial(st SavedState) (SavedState, bool) {
	if !st.Whole || !s.ok {
		return st, false
	}
	p := SavedState{Head: st.Head}
	in := make(map[string]struct{}, len(st.Keys))
	for i, k := range st.Keys {
		in[k] = struct{}{}
		if h, ok := s.hash[k]; !ok || h != s.sum(st.Records[i]) {
			p.Keys = append(p.Keys, k)
			p.Records = append(p.Records, st.Records[i])
		}
	}
	for k := range s.hash {
		if _, ok := in[k]; !ok {
			p.Deleted = append(p.Deleted, k)
		}
	}
	return p, true
}
