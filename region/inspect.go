package region

import "time"

// KeyView is what the State holds of one key, for an operator: read by
// Inspect, which changes nothing.
type KeyView struct {
	Key string
	// Known is false for a key the State holds no state of: every region
	// then holds its initial share, as far as this region knows.
	Known bool
	// Regions lists every region of Config.Regions, in its order.
	Regions []RegionView
	// Resting is true for a key at rest (rest.go); Held for a key whose
	// rule is held for a disagreement between regions (rules.go).
	Resting, Held bool
}

// RegionView is one region's part of a key.
type RegionView struct {
	Region string
	Self   bool
	// SharePPM is the region's applied share: ours as Share reports it, a
	// peer's as its latest exchange report listed it (its initial share
	// while none did).
	SharePPM int64
	// Demand is the region's smoothed demand, in tokens per epoch.
	Demand float64
	// Heard is when the region's latest exchange report arrived (zero for
	// ours, and for a region never heard).
	Heard time.Time
}

// Inspect returns what the State holds of key, changing nothing.
func (s *State) Inspect(key string) KeyView {
	ks := s.byKey[key]
	v := KeyView{Key: key, Known: ks != nil, Regions: make([]RegionView, s.n)}
	for k, name := range s.cfg.Regions {
		r := RegionView{Region: name, Self: k == s.self, SharePPM: s.initial[k]}
		if k != s.self {
			r.Heard = s.exchHeard[k]
		}
		if ks != nil {
			r.Demand = ks.ewma()[k]
			switch {
			case k == s.self:
				r.SharePPM = s.shareOf(ks)
			case s.listed(ks, k):
				r.SharePPM = ks.shares()[k]
			}
		}
		v.Regions[k] = r
	}
	if ks != nil {
		v.Resting = ks.resting()
		v.Held = s.held(s.cfg.Policy(key))
	}
	return v
}

// Inspect is State.Inspect on the Node's state (meaningful on the holder:
// another replica's state is not kept).
func (n *Node) Inspect(key string) KeyView { return n.st.Inspect(key) }

// LastEpoch is State.LastEpoch.
func (n *Node) LastEpoch() uint64 { return n.st.LastEpoch() }
