package region

import (
	"fmt"
	"time"
)

// Receive merges a report from a peer (another region, or another replica of
// this region) received at now. Merging takes the maximum of every counter,
// so it is idempotent and order-free; demand and grant tallies are summed
// over the replicas of a region, each replica counting with its latest
// report only.
//
// A report that is malformed (ErrMalformed), from an unknown region
// (ErrUnknownRegion), not newer than the last one from its replica
// (ErrStale), or in which a counter of a known generation went down
// (ErrRegressed) is rejected whole and changes nothing. Counters of a
// generation older than the key's are never merged into the newer one; a
// report from this very replica (an echo) is ignored and returns nil.
//
// Rows of reports from other replicas of this region are ignored: only this
// region's exchanging replica writes its row, and that is this State.
func (s *State) Receive(now time.Time, r Report) error {
	k, echo, err := s.checkSender(&r)
	if err != nil || echo {
		return err
	}
	slot, known := s.replicaBy[replicaKey(r.Region, r.Replica)]
	in := inbound{k: k, epoch: r.Epoch, exchange: r.Exchange && k != s.self}
	if err := s.checkStale(&r, k, slot, known, in.exchange); err != nil {
		return err
	}
	s.noteStream(k, &r)
	in.cols, in.myCol = s.columns(r.Regions), -1
	for c, j := range in.cols {
		if j == s.self {
			in.myCol = c
		}
	}

	// Pass 1: find the keys and reject regressions before changing anything.
	if err := s.findKeys(&r, &in); err != nil {
		return err
	}

	// Pass 2: merge.
	if !known {
		slot = int(s.slotFor(k, r.Replica))
	}
	s.noteReport(now, &r, k, slot, in.exchange)
	s.missed(&r, slot)
	s.asked(&r)
	in.slot, in.inc = int32(slot), s.replicas[slot].inc
	s.mergeKeys(now, &r, &in)
	s.refreshed(&r, &in)
	return nil
}

// inbound is the report being received, as this State indexes it.
type inbound struct {
	k        int    // the sender's region
	slot     int32  // the sender replica's slot (set for pass 2)
	inc      uint32 // the incarnation of that slot (set for pass 2)
	epoch    uint64 // the report's epoch
	exchange bool   // an exchange report of a peer region: its rows are merged
	cols     []int  // the report's columns mapped to our regions (-1: unknown)
	myCol    int    // our column in the report, -1 when it has none
}

// checkSender validates the report's shape and finds its sender's region; echo: our own report.
func (s *State) checkSender(r *Report) (k int, echo bool, err error) {
	if _, err := checkShape(r); err != nil {
		return 0, false, err
	}
	k, ok := s.index[r.Region]
	if !ok {
		return 0, false, fmt.Errorf("%w: report from %q, not in %v", ErrUnknownRegion, r.Region, s.cfg.Regions)
	}
	return k, k == s.self && r.Replica == s.cfg.Replica, nil
}

// checkStale rejects a report not newer than the last one of its kind from its replica or region.
func (s *State) checkStale(r *Report, k, slot int, known, exchange bool) error {
	if known {
		// A replica sends up to two reports an epoch, its tallies and then
		// (when it runs the exchange) its decisions: each kind in order.
		last := s.replicas[slot].lastTally
		if r.Exchange {
			last = s.replicas[slot].lastExch
		}
		if r.Epoch <= last {
			return fmt.Errorf("%w: report from %q/%q epoch %d, have epoch %d", ErrStale, r.Region, r.Replica, r.Epoch, last)
		}
	}
	if exchange && r.Epoch <= s.exchEpoch[k] {
		// Exchange epochs of a region only grow, across restarts and
		// fail-overs too (they are persisted): this one is old.
		return fmt.Errorf("%w: exchange report from %q epoch %d, have epoch %d", ErrStale, r.Region, r.Epoch, s.exchEpoch[k])
	}
	return nil
}

// findKeys fills s.recvKS with each entry's key (nil: not held), rejecting counters that went down.
func (s *State) findKeys(r *Report, in *inbound) error {
	// The lookups first, in a loop of their own: each misses in cache, and
	// without the checks between them the processor overlaps those misses.
	s.recvKS = s.recvKS[:0]
	for i := range r.Keys {
		s.recvKS = append(s.recvKS, s.byKey[r.Keys[i].Key])
	}
	if !in.exchange {
		return nil
	}
	for i, ks := range s.recvKS {
		e := &r.Keys[i]
		if ks == nil || e.Generation == 0 {
			continue
		}
		if err := s.checkRegress(ks, in.k, e, in.cols, in.myCol); err != nil {
			return fmt.Errorf("%w: report from %q/%q epoch %d", err, r.Region, r.Replica, r.Epoch)
		}
	}
	return nil
}

// noteReport records the report as its replica's latest, and an exchange report as its region's.
func (s *State) noteReport(now time.Time, r *Report, k, slot int, exchange bool) {
	rep := &s.replicas[slot]
	rep.lastEpoch, rep.lastHeard = max(rep.lastEpoch, r.Epoch), now
	rep.noteRules(r)
	rep.since = max(rep.since, streamSince(r))
	if r.Exchange {
		rep.lastExch = r.Epoch
	} else {
		rep.lastTally = r.Epoch
	}
	if exchange {
		s.exchEpoch[k] = r.Epoch
		s.exchHeard[k] = now
		if since := streamSince(r); since != s.exchSince[k] {
			s.cover[k] = covered{} // a new stream: nothing of it refreshed yet
			s.exchSince[k] = since
		}
		s.exchRefresh[k] = r.Refresh
	}
}

// mergeKeys merges each entry into its key (created if worth it): tallies, and a peer's exchange state.
func (s *State) mergeKeys(now time.Time, r *Report, in *inbound) {
	k, exchange, cols, myCol := in.k, in.exchange, in.cols, in.myCol
	for i := range r.Keys {
		e := &r.Keys[i]
		ks := s.recvKS[i]
		if ks == nil {
			if !s.worthCreating(e, exchange) {
				continue
			}
			ks = s.addKey(e.Key)
		}
		s.touch(ks)
		ks.setTally(in.slot, in.inc, in.epoch, e.Demand, e.Granted)
		if e.Demand > 0 {
			ks.heardDemand = true
		}
		if !exchange {
			continue
		}
		ks.seen()[k], ks.cur()[k], ks.shares()[k] = in.epoch, e.Generation, e.SharePPM
		if e.Generation != 0 {
			s.mergeRow(now, ks, k, e, cols, myCol)
		}
		if myCol >= 0 && (len(e.Exits) > 0 || len(e.Settled) > 0) {
			s.settleExits(now, ks, k, e, cols, myCol)
		}
		ks.noteAnnouncing(k, e)
	}
}

// settleExits settles against peer k's exit records for the key and takes its acknowledgements of ours.
func (s *State) settleExits(now time.Time, ks *keyState, k int, e *KeyReport, cols []int, myCol int) {
	for x := range e.Exits {
		s.settle(now, ks, k, &e.Exits[x], cols, myCol)
	}
	if len(e.Settled) > 0 {
		for _, x := range ks.exits {
			if e.Settled[myCol] >= x.gen {
				x.acked |= 1 << k
			}
		}
	}
}

// noteAnnouncing notes whether peer k still announces exit records for the key, awaiting our acknowledgement.
func (ks *keyState) noteAnnouncing(k int, e *KeyReport) {
	if n := len(e.Exits); n > 0 {
		ks.settled()[k] = max(ks.settled()[k], e.Exits[n-1].Generation)
		ks.announcing |= 1 << k
	} else {
		ks.announcing &^= 1 << k
	}
}

// checkRegress reports a counter of a known generation that went down.
func (s *State) checkRegress(ks *keyState, k int, e *KeyReport, cols []int, myCol int) error {
	n := s.n
	if e.Generation == ks.rowGen()[k] {
		for c, j := range cols {
			if j < 0 {
				continue
			}
			if e.Row[c] < ks.rows()[k*n+j] || (len(e.Taken) > 0 && e.Taken[c] < ks.taken()[k*n+j]) {
				return fmt.Errorf("%w: key %q generation %d: row of %q column %q went down", ErrRegressed, e.Key, e.Generation, s.cfg.Regions[k], s.cfg.Regions[j])
			}
		}
	}
	if e.Generation == ks.gen && myCol >= 0 {
		tk := int64(0)
		if len(e.Taken) > 0 {
			tk = e.Taken[myCol]
		}
		if e.Row[myCol] < ks.in()[k] || tk < ks.inTaken()[k] || (e.TokensWindow == ks.tokInWin()[k] && tokensAt(e.Tokens, myCol) < ks.tokIn()[k]) || e.TokensWindow < ks.tokInWin()[k] {
			return fmt.Errorf("%w: key %q generation %d: gifts of %q to us went down", ErrRegressed, e.Key, e.Generation, s.cfg.Regions[k])
		}
	}
	return nil
}

// worthCreating reports whether a report entry for a key we do not hold
// should make us hold it: someone has demand, or a peer has exchange state
// for it. We then know which generation our peers are in when demand comes,
// and join theirs rather than start one they would all have to move to.
func (s *State) worthCreating(e *KeyReport, exchange bool) bool {
	return e.Demand > 0 || (exchange && e.Generation > 0)
}

// mergeRow merges peer k's row for the key: a newer generation replaces the
// row, the same one takes the maximum, an older one is ignored.
func (s *State) mergeRow(now time.Time, ks *keyState, k int, e *KeyReport, cols []int, myCol int) {
	n, g := s.n, e.Generation
	row, tk := ks.rows()[k*n:(k+1)*n], ks.taken()[k*n:(k+1)*n]
	changed := false
	switch {
	case g > ks.rowGen()[k]:
		clear(row)
		clear(tk)
		ks.rowGen()[k] = g
		changed = true
		fallthrough
	case g == ks.rowGen()[k]:
		ks.bases()[k] = e.Base
		for c, j := range cols {
			if j < 0 {
				continue
			}
			if v := e.Row[c]; v > row[j] {
				row[j], changed = v, true
			}
			if len(e.Taken) > 0 {
				if v := e.Taken[c]; v > tk[j] {
					tk[j], changed = v, true
				}
			}
		}
	default:
		return // an older generation: never merged into a newer one
	}
	if myCol >= 0 && len(e.In) > 0 {
		for _, x := range ks.exits {
			if x.gen == g {
				x.ack[k] = max(x.ack[k], e.In[myCol]) // k is still in a generation we left
			}
		}
	}
	if g != ks.gen {
		return
	}
	if changed {
		ks.lastTransfer = now
	}
	if myCol >= 0 {
		s.mergeTokens(ks, k, e, myCol)
		s.applyIn(now, ks, k, e.Row[myCol], e.Taken, myCol)
		if len(e.In) > 0 {
			ks.ack()[k] = max(ks.ack()[k], e.In[myCol])
		}
		if len(e.InTaken) > 0 {
			ks.ackTkn()[k] = max(ks.ackTkn()[k], e.InTaken[myCol])
		}
	}
}

// applyIn raises what we know k gave to (or reclaimed from) us in our
// generation.
func (s *State) applyIn(now time.Time, ks *keyState, k int, gift int64, taken []int64, myCol int) {
	if gift > ks.in()[k] {
		ks.in()[k] = gift
		ks.lastTransfer = now
		s.raised(ks)
	}
	if len(taken) > 0 && taken[myCol] > ks.inTaken()[k] {
		ks.inTaken()[k] = taken[myCol]
		ks.lastTransfer = now
	}
}

// settle handles peer k's exit record. If k left our generation, its final
// row still counts, and what we gave it (or took from it) beyond what it had
// applied comes back to us: k will never apply it. If k left the generation
// we left last, we can still take back our unapplied gifts to it, into our
// current base.
func (s *State) settle(now time.Time, ks *keyState, k int, x *Exit, cols []int, myCol int) {
	at := func(v []int64) int64 {
		if len(v) == 0 {
			return 0
		}
		return v[myCol]
	}
	if ks.gen != 0 && x.Generation == ks.gen {
		s.finalRow(now, ks, k, x, cols)
		s.applyIn(now, ks, k, x.Row[myCol], x.Taken, myCol)
		if r := s.ownRow(ks)[k] - at(x.In); r > ks.refund()[k] {
			ks.refund()[k] = r
			ks.lastTransfer = now
			s.raised(ks)
		}
		if q := s.ownTaken(ks)[k] - at(x.InTaken); q > ks.unclaim()[k] {
			ks.unclaim()[k] = q
			ks.lastTransfer = now
		}
		// The record is k's final acknowledgement.
		ks.ack()[k] = max(ks.ack()[k], at(x.In))
		ks.ackTkn()[k] = max(ks.ackTkn()[k], at(x.InTaken))
		return
	}
	if ks.gen == 0 {
		return // retired: what comes back is lost
	}
	for _, p := range ks.exits {
		if p.gen != x.Generation {
			continue
		}
		// Gifts k never applied come back. Our reclaims from k that k
		// had not acknowledged were given up when we left; the part k
		// applied after all is ours again.
		r := p.row[k] - at(x.In)
		q := at(x.InTaken) - p.taken[k]
		if r+q > p.refund[k] {
			ks.base = clamp(ks.base+r+q-p.refund[k], -PPM, PPM)
			p.refund[k] = r + q
			ks.lastTransfer = now
			s.raised(ks)
		}
	}
}

// raised notes a key whose computed share may have risen, for Apply.
func (s *State) raised(ks *keyState) {
	if !ks.toApply {
		ks.toApply = true
		s.toApply = append(s.toApply, ks)
	}
}
