package region

import "fmt"

// Debug describes the internal state of a key, for test failure messages.
func (s *State) Debug(key string) string {
	ks := s.byKey[key]
	if ks == nil {
		return "none"
	}
	out := fmt.Sprintf("gen %d base %d own %d applied %d in %v inTaken %v taken %v row %v ackTkn %v unclaim %v cur %v seen %v exch %v ewma %.0f lastDemand %v",
		ks.gen, ks.base, s.own(ks), ks.applied, ks.in(), ks.inTaken(), s.ownTaken(ks), s.ownRow(ks), ks.ackTkn(), ks.unclaim(), ks.cur(), ks.seen(), s.exchEpoch, ks.ewma(), ks.lastDemand.Unix()) + fmt.Sprintf(" pub %v cur0 %v fresh %v unheard %b announcing %b settled %v exits %d tallies %v", ks.pub, ks.cur0, s.fresh, ks.unheard, ks.announcing, ks.settled(), len(ks.exits), ks.tallies)
	for _, x := range ks.exits {
		out += fmt.Sprintf(" exit{gen %d taken %v intake %v}", x.gen, x.taken, x.intake)
	}
	return out
}

// Ledger returns the generation, base and number of exit records of a key.
func (s *State) Ledger(key string) (gen uint64, base int64, exits int) {
	ks := s.byKey[key]
	if ks == nil {
		return 0, 0, 0
	}
	return ks.gen, ks.base, len(ks.exits)
}

// Own returns the share of key the State computes from its counters: what
// its stored share converges to (the initial share for a key without
// exchange state).
func (s *State) Own(key string) int64 {
	ks := s.byKey[key]
	if ks == nil || ks.gen == 0 {
		return s.initial[s.self]
	}
	return s.own(ks)
}

// Synced reports whether the State knows the stored share of key (false
// after a restore or a write that may have failed, until it rewrites it).
func (s *State) Synced(key string) bool {
	ks := s.byKey[key]
	return ks == nil || ks.applied >= 0
}

// Reclaims returns Σ of the reclaims the State holds for key in its current
// generation.
func (s *State) Reclaims(key string) int64 {
	ks := s.byKey[key]
	if ks == nil || ks.gen == 0 {
		return 0
	}
	var sum int64
	for _, v := range s.ownTaken(ks) {
		sum += v
	}
	return sum
}

// State returns the exchange state a Node runs, for tests' checks.
func (n *Node) State() *State { return n.st }

// Tokens returns the key's generation and our row of tokens given with
// share in it.
func (s *State) Tokens(key string) (gen uint64, given []int64) {
	ks := s.byKey[key]
	if ks == nil || ks.gen == 0 {
		return 0, nil
	}
	return ks.gen, append([]int64(nil), ks.tok()...)
}

// PeerView returns what the State holds of peer region for key: the demand
// of that region's replicas' tallies that stand, and whether the peer's
// exchange state for the key is known and the generation it is listed in
// (0: none, or unknown).
func (s *State) PeerView(key, region string) (demand int64, known bool, gen uint64) {
	ks, k := s.byKey[key], s.index[region]
	if ks == nil {
		return 0, false, 0
	}
	for _, e := range ks.tallies {
		if r := &s.replicas[e.slot]; r.live && r.inc == e.inc && r.region == k && e.epoch >= r.since {
			demand += e.demand
		}
	}
	return demand, s.known(ks, k), s.peerGen(ks, k)
}
