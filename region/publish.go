package region

import (
	"slices"
	"time"
)

// Report returns the report to publish for the latest epoch: for every key
// with exchange state, our generation, base, row, acknowledgements, share
// and the local tallies closed by the latest Epoch, plus the exit records of
// generations we left and still announce; and for a key we hold no state
// for, the acknowledgement of the exit records peers announce. It reads
// only committed state, so a gift that was not committed is never
// announced; publish it only once the snapshot holding that state is
// persisted (see Epoch). Calling it twice returns the same epoch, which
// receivers count once.
//
// The slices in the report are freshly allocated; the caller may keep it.
func (s *State) Report() Report {
	n := s.n
	r := s.header(true)
	list := s.reportList(&r)
	entries, ints, acks := s.reportSize(list)
	r.Regions = slices.Clone(s.cfg.Regions)
	r.Keys = make([]KeyReport, 0, entries+len(s.delta.gone))
	b := rowSlab{buf: make([]int64, ints), n: n}
	ackBuf := make([]uint64, acks)
	for _, ks := range list {
		r.Keys = append(r.Keys, KeyReport{})
		if reported(ks) {
			s.keyReport(&r.Keys[len(r.Keys)-1], ks, &b, &ackBuf)
		} else { // it had an entry: say it has none now
			r.Keys[len(r.Keys)-1] = KeyReport{Key: ks.key, SharePPM: s.shareOf(ks), Demand: ks.held.demand, Granted: ks.held.granted}
		}
	}
	clear(list)
	if s.cfg.Refresh >= 0 {
		s.goneEntries(&r)
	}
	return r
}

// reportSize counts what Report holds for the keys listed: entries, and values of counters and of acknowledgements.
func (s *State) reportSize(list []*keyState) (entries, ints, acks int) {
	n := s.n
	for _, ks := range list {
		if !reported(ks) {
			continue
		}
		entries++
		if ks.gen != 0 {
			ints += 5 * n
		}
		if ks.announcing != 0 {
			acks += n
		}
		ints += 4 * n * len(ks.exits)
	}
	return entries, ints, acks
}

// keyReport fills e, a key's entry in our report, its rows carved from b and acks.
func (s *State) keyReport(e *KeyReport, ks *keyState, b *rowSlab, acks *[]uint64) {
	n := s.n
	e.Key, e.Generation = ks.key, ks.gen
	e.SharePPM = s.shareOf(ks) // ks is held: Report lists s.keys
	e.Demand, e.Granted = ks.held.demand, ks.held.granted
	if ks.gen != 0 {
		e.Base = s.effectiveBase(ks)
		e.Row = b.take(s.ownRow(ks))
		e.Taken = b.takeOpt(s.ownTaken(ks))
		e.In = b.takeOpt(ks.in())
		e.InTaken = b.takeOpt(ks.inTakenStored())
		e.Tokens, e.TokensWindow = b.takeOpt(ks.tok()), ks.tokWin
	}
	if ks.announcing != 0 {
		e.Settled = (*acks)[:n:n]
		*acks = (*acks)[n:]
		copy(e.Settled, ks.settled())
	}
	if ks.gen != 0 && ks.applied < 0 {
		// An exit record says what we had applied in a generation we left,
		// and a giver takes back what it says we did not. While the store's
		// share is unknown (restored, or a write unconfirmed) the store may
		// still apply a gift this state has forgotten: announce no exit
		// until the share is written again.
		return
	}
	for _, x := range ks.exits {
		e.Exits = append(e.Exits, Exit{
			Generation: x.gen,
			Row:        b.take(x.row),
			Taken:      b.takeOpt(x.taken),
			In:         b.take(x.in),
			InTaken:    b.takeOpt(x.intake),
		})
	}
}

// rowSlab hands out rows of n counters, copies of ours, carved from one
// allocation: a report or snapshot of many keys allocates a handful of
// slabs rather than a row per key.
type rowSlab struct {
	buf []int64
	n   int
}

// take returns a copy of v carved from the slab.
func (b *rowSlab) take(v []int64) []int64 {
	out := b.buf[:b.n:b.n]
	b.buf = b.buf[b.n:]
	copy(out, v)
	return out
}

// takeOpt is take for a row sent only when not all zero (nil then).
func (b *rowSlab) takeOpt(v []int64) []int64 {
	for _, x := range v {
		if x != 0 {
			return b.take(v)
		}
	}
	return nil
}

// reported reports whether a key goes in our exchange reports: we have
// state for it, announce an exit, or acknowledge a peer's.
func reported(ks *keyState) bool {
	return ks.gen != 0 || len(ks.exits) > 0 || ks.announcing != 0
}

// Tally closes the local tallies of the epoch at now and returns them as a
// tally-only report (Exchange false), to publish at once.
//
// It is the first phase of an epoch. The replica running its region's
// exchange calls Tally at the start of each period and Epoch a little later
// (Config.Period / 4 is plenty on one continent; more than the one-way
// delay between regions): Epoch then steers by the tallies every region
// just closed rather than those of the period before, which saves a period
// of convergence after a change of demand. Epoch without a Tally before it
// closes the tallies itself, as one phase.
//
// A replica that does not hold its region's exchange lease calls Observe
// and Tally only; the exchanging replica sums its tallies with its own.
// When it takes the lease over it calls Restore with the region's persisted
// snapshot and runs Epoch from then on. Keys with nothing to report and no
// exchange state are forgotten.
func (s *State) Tally(now time.Time) Report {
	s.advance(now)
	s.tallied = true
	s.agree(now) // a replica that does not run the exchange enforces it too
	r := s.header(false)
	r.Regions = slices.Clone(s.cfg.Regions)
	// A key Observe marked (keyMeta.sameAt) closes to the tally it closed
	// to before, which is published and not empty: closeTally would list
	// nothing and keep it (unless it publishes by noise, HoldDemand, or
	// every tally, full reports; EveryKey, the reference, visits it). Its
	// open tally restarts by closeTallies.
	// A late epoch's tallies close per epoch (tallySpan), which Observe's
	// marks did not compare: every key is visited.
	// A key marked idle (keyMeta.idle) that rests was not observed since
	// its last Tally, which found nothing to close: it has nothing to close
	// now, with any span, and a generation keeps it. Most keys of a large
	// deployment are such keys most of the time: held, not asked. Stepping
	// over them spares Tally a cache miss a key (BenchmarkTallyHeldKeys).
	lazy, same := s.cfg.Refresh >= 0 && !s.cfg.HoldDemand && !s.cfg.EveryKey && s.tallySpan() == 1, uint32(s.tallyGen)
	idleOK := !s.cfg.EveryKey
	for i := 0; i < len(s.keys); {
		if m := &s.meta[i]; lazy && m.sameAt == same || idleOK && m.idle && m.rest != restAwake {
			i++
			continue
		}
		ks := s.keys[i]
		cur := s.closing(ks)
		if ks.pub != cur {
			s.touch(ks)
		}
		ks.pub, ks.cur0 = cur, tally{}
		if s.closeTally(ks) {
			s.touch(ks)
			if r.Keys == nil { // sized as the latest tally report's
				r.Keys = make([]KeyReport, 0, roomFor(s.sizes.tally))
			}
			r.Keys = append(r.Keys, s.tallyEntry(ks))
		} else if s.forgotten(ks) {
			s.removeKey(i)
			continue
		}
		s.meta[i].idle = idleOK && ks.pub == (tally{}) && ks.held == (tally{}) && ks.gen != 0
		i++
	}
	s.closeTallies()
	s.tallyRefresh(&r)
	s.sizes.tally = len(r.Keys)
	return r
}

// roomFor is the capacity to give a slice sized as the latest one of its
// kind, which held n: an eighth more, so that an epoch a little larger than
// the one before fills it rather than copying it whole to grow it (at a
// million keys such copies were a third of Tally's allocation).
func roomFor(n int) int { return n + n/8 }

// forgotten reports whether Tally forgets ks: nothing to report, no
// exchange state, no demand left to smooth.
func (s *State) forgotten(ks *keyState) bool {
	if ks.pub != (tally{}) || ks.held != (tally{}) || ks.gen != 0 || len(ks.exits) > 0 || ks.announcing != 0 || len(ks.tallies) > 0 || s.highestPeerGen(ks) != 0 {
		return false
	}
	s.wake(ks) // its smoothed demand as if it had not rested
	return !slices.ContainsFunc(ks.ewma(), func(v float64) bool { return v >= 1 })
}
