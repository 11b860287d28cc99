package region

import "time"

// SiblingsHeard reports whether another replica of this region was heard
// within StaleAfter of now: agents may then lease through a replica whose
// grants this one never sees (the lease service keeps share raises only for
// keys it sees spent from, lease/service/shares.go).
func (s *State) SiblingsHeard(now time.Time) bool {
	for i := range s.replicas {
		r := &s.replicas[i]
		if r.live && r.region == s.self && now.Sub(r.lastHeard) <= s.cfg.StaleAfter {
			return true
		}
	}
	return false
}

// SiblingsHeard is State.SiblingsHeard on the Node's state.
func (n *Node) SiblingsHeard(now time.Time) bool { return n.st.SiblingsHeard(now) }
