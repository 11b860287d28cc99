package region

import (
	"cmp"
	"math"
	"slices"
)

// This file holds what makes reports deltas (docs/DESIGN.md, "Reports are
// deltas"): which keys a report lists, and what a receiver learns of the keys
// it leaves out. The counters in an entry only grow and merge by maximum, so
// a lost delta costs freshness, never safety; the refresh of its key's
// bucket repairs it.

// maxRefresh bounds Config.Refresh and Report.Refresh (an hour of epochs at
// the default period).
const maxRefresh = 3600

// RefreshBuckets is the number of refresh buckets keys are hashed into
// (RefreshBucket). A delta report lists every key of the buckets it
// refreshes, so that a receiver learns which keys the sender no longer has
// as surely as from a full report, a slice at a time.
const RefreshBuckets = 4096

// RefreshBucket is key's refresh bucket: FNV-1a of its bytes, the same in
// every region and release.
func RefreshBucket(key string) uint32 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * 0x100000001b3
	}
	return uint32(h % RefreshBuckets)
}

// inRange reports whether bucket b is among the count buckets from from
// (mod RefreshBuckets).
func inRange(b, from, count uint32) bool {
	if count >= RefreshBuckets {
		return true
	}
	return (b+RefreshBuckets-from)%RefreshBuckets < count
}

// streamSince is the start of the stream a report belongs to: its Since, or,
// for a full report, its own epoch (nothing older stands).
func streamSince(r *Report) uint64 {
	if r.Refresh == 0 {
		return r.Epoch
	}
	return r.Since
}

// deltas is the sending side's state of its two streams of reports.
type deltas struct {
	// fullTally, fullReport: the next report of the kind lists every key
	// (a new stream, or a peer's new stream, which knows nothing of ours).
	fullTally, fullReport bool
	// newTally, newReport: the next report of the kind starts a new stream
	// (a new State, a take-over): listings of the old one are void.
	newTally, newReport     bool
	tallySince, reportSince uint64
	tally, report           cursor
	// prevTally and prevReport are the epochs of our latest report of each
	// kind in its stream (Report.Prev of the next); resendTally and
	// resendReport the epoch from which a peer asked us to list every
	// change again (0: none).
	prevTally, prevReport     uint64
	resendTally, resendReport uint64
	// talliedAt is the epoch of the latest Tally: a demand it published
	// need not go in that epoch's exchange report. reportedAt is the epoch
	// of the latest exchange report.
	talliedAt, reportedAt uint64
	// gone are keys dropped whose last listing still stands at receivers.
	gone []goneKey
	// streams is, per region, the Since of its exchange stream as last
	// seen: a new one means its holder knows nothing of our state.
	streams []uint64
	list    []*keyState // scratch: the keys a Report lists
	// refreshed is scratch: the keys of the buckets a tally report
	// refreshes.
	refreshed []*keyState
}

// cursor is a stream's round-robin over the refresh buckets.
type cursor struct {
	prev        uint64 // Prev of the latest report, for one repeated in its epoch
	next        uint32 // the first bucket of the next refresh
	at          uint64 // the epoch of the latest refresh
	from, count uint32 // the latest refresh's buckets
}

// advance returns the buckets the report of epoch e refreshes: enough that
// every bucket is refreshed at least once every refresh epochs, however many
// epochs passed since the last; all of them when full. A second report in
// the same epoch refreshes the same buckets.
func (c *cursor) advance(e uint64, refresh int, full bool) (from, count uint32) {
	if c.at == e {
		return c.from, c.count
	}
	el := uint64(refresh)
	if c.at != 0 && e > c.at {
		el = min(e-c.at, el)
	}
	n := (RefreshBuckets*el + uint64(refresh) - 1) / uint64(refresh)
	if full {
		n = RefreshBuckets
	}
	c.from, c.count = c.next, uint32(min(n, RefreshBuckets))
	c.next = (c.next + c.count) % RefreshBuckets
	c.at = e
	return c.from, c.count
}

// goneKey is a dropped key to list once as empty, so that receivers learn at
// once what the refresh of its bucket would tell them later.
type goneKey struct {
	key             string
	tally, exch     bool
	tallyAt, exchAt uint64 // epoch it was listed in by each stream (0: not yet)
	at              uint64 // epoch it was dropped, for resends
}

// restartStreams makes the next reports of both kinds start new streams,
// full: listings made before are void at receivers.
func (s *State) restartStreams() {
	s.delta.fullTally, s.delta.fullReport = true, true
	s.delta.newTally, s.delta.newReport = true, true
	s.delta.prevTally, s.delta.prevReport, s.delta.resendTally, s.delta.resendReport = 0, 0, 0, 0
	s.delta.gone = s.delta.gone[:0]
}

// header returns a report's header fields for the stream of its kind, and
// the refresh buckets it covers.
func (s *State) header(exchange bool) Report {
	r := Report{Region: s.cfg.Self, Replica: s.cfg.Replica, Epoch: s.epoch, SentAt: s.now, Exchange: exchange}
	if s.cfg.Rules != nil {
		var defs []RuleDef
		r.Policy, defs = s.cfg.Rules()
		r.Rules = slices.Clone(defs)
	}
	if s.cfg.Refresh < 0 {
		return r
	}
	d := &s.delta
	since, restart, c, full, prev := &d.tallySince, &d.newTally, &d.tally, &d.fullTally, &d.prevTally
	if exchange {
		since, restart, c, full, prev = &d.reportSince, &d.newReport, &d.report, &d.fullReport, &d.prevReport
	}
	if *restart || *since == 0 {
		// A full report answering a peer's new stream stays in ours:
		// starting one would have every peer answer in turn.
		*since, *restart, *prev = s.epoch, false, 0
	}
	if from, all := s.resendFrom(exchange); from != 0 {
		r.Resent, *full = from, *full || all
	}
	r.Refresh, r.Since, r.Prev = uint32(s.cfg.Refresh), *since, *prev
	if *prev == s.epoch { // the same epoch again: the same report
		r.Prev = c.prev
	} else {
		c.prev = *prev
	}
	*prev = s.epoch
	r.RefreshFrom, r.RefreshCount = c.advance(s.epoch, s.cfg.Refresh, *full)
	r.Resend = s.resendRequests()
	if !exchange {
		r.Resend = s.lateRequests(r.Resend)
	}
	return r
}

// closeTally takes the tallies just closed (ks.pub) into the ones every
// region steers by (ks.held) when they are news (hold), and reports whether
// the tally report lists the key for that.
func (s *State) closeTally(ks *keyState) bool {
	if s.cfg.Refresh < 0 {
		ks.held = ks.pub
		return ks.pub != (tally{})
	}
	held := ks.hold
	if s.cfg.HoldDemand {
		held = ks.holdNoise
	}
	if held() {
		ks.tallyAt = s.epoch
		return true
	}
	return false
}

// hold publishes the epoch's tallies (into ks.held) when they differ from
// those last published: every region then steers by exactly the tallies a
// full report would carry, and a key whose demand did not change is not
// listed.
func (ks *keyState) hold() bool {
	if ks.pub != ks.held {
		return ks.publish(ks.pub)
	}
	return false
}

// holdNoise is hold under Config.HoldDemand: it decides whether the epoch's
// tallies are news against the demand last published, and publishes them
// (into ks.held) if so. In units of the
// published demand's Poisson noise (in requests of one token, which
// overstates the noise of costlier requests only by sending more), news is:
// demand that appeared or vanished; a shift that a two-sided CUSUM of the
// epochs' deviations detects (slack 1/2, alarm above 3/2: a step of 2 noise
// widths is news at once, one of 1 in two epochs or three), for which the
// mean of the epochs since the shift
// began is published; or a mean over every epoch since the last
// publication more than twice its own noise off (a bias within the CUSUM's
// slack, found as the epochs add up), which is published. Moves under 1/32
// of the demand are never news. A steady demand of 400 an epoch is so
// published about one epoch in six, within about a noise width of its mean
// (TestHoldDemandPublishesNews), and a change within an epoch or three.
func (ks *keyState) holdNoise() bool {
	h, d := ks.held.demand, ks.pub.demand
	if (h == 0) != (d == 0) {
		return ks.publish(ks.pub)
	}
	if d == 0 {
		return false
	}
	sigma, floor := math.Sqrt(float64(h)), float64(h)/32
	z := float64(d-h) / sigma
	ks.up = float32(max(0, float64(ks.up)+z-0.5))
	ks.down = float32(max(0, float64(ks.down)-z-0.5))
	if ks.up == 0 && ks.down == 0 {
		ks.run = tallySum{}
	} else {
		ks.run.add(ks.pub)
	}
	ks.all.add(ks.pub)
	if ks.up > 1.5 || ks.down > 1.5 {
		if m := ks.run.mean(); math.Abs(float64(m.demand-h)) > floor {
			return ks.publish(m)
		}
		ks.up, ks.down, ks.run = 0, 0, tallySum{}
	}
	if n := float64(ks.all.n); n >= 2 {
		m := ks.all.mean()
		if diff := math.Abs(float64(m.demand - h)); diff > 2*sigma/math.Sqrt(n) && diff > floor {
			return ks.publish(m)
		}
	}
	return false
}

// publish makes t the published tallies and starts hold's statistics afresh.
func (ks *keyState) publish(t tally) bool {
	ks.held, ks.up, ks.down, ks.run, ks.all = t, 0, 0, tallySum{}, tallySum{}
	return true
}

// tallySum adds up tallies to take their mean.
type tallySum struct {
	demand, granted int64
	n               uint32
}

func (t *tallySum) add(v tally) {
	t.demand, t.granted, t.n = t.demand+v.demand, t.granted+v.granted, t.n+1
}

func (t *tallySum) mean() tally {
	n := float64(max(t.n, 1))
	return tally{int64(math.Round(float64(t.demand) / n)), int64(math.Round(float64(t.granted) / n))}
}

// tallyEntry is a key's entry in a tally report.
func (s *State) tallyEntry(ks *keyState) KeyReport {
	return KeyReport{Key: ks.key, SharePPM: s.shareOf(ks), Demand: ks.held.demand, Granted: ks.held.granted}
}

// tallyRefresh adds to the tally report r the keys of the buckets it
// refreshes not listed yet, and the empty entries of keys dropped with
// tallies standing at receivers.
func (s *State) tallyRefresh(r *Report) {
	if s.cfg.Refresh < 0 {
		return
	}
	d := &s.delta
	from := r.Resent
	keys := s.keys
	if from == 0 {
		keys = s.refreshedKeys(r) // neither refreshed nor asked for again: the others
	}
	for _, ks := range keys {
		switch {
		case ks.tallyAt == s.epoch:
		case ks.held != (tally{}) && inRange(ks.bucket, r.RefreshFrom, r.RefreshCount),
			from != 0 && ks.tallyAt >= from: // asked again; a drop to nothing too
			ks.tallyAt = s.epoch
			r.Keys = append(r.Keys, s.tallyEntry(ks))
		}
	}
	clear(d.refreshed) // not to keep dropped keys alive
	d.fullTally, d.resendTally = false, 0
	d.talliedAt = s.epoch
	for i := range d.gone {
		g := &d.gone[i]
		if g.tally && (g.tallyAt == 0 || g.tallyAt == s.epoch || from != 0 && g.at >= from) && s.byKey[g.key] == nil {
			g.tallyAt = s.epoch
			r.Keys = append(r.Keys, KeyReport{Key: g.key, SharePPM: s.initial[s.self]})
		}
	}
	s.pruneGone()
}

// refreshedKeys returns the keys of the buckets r refreshes in State.keys's
// order, the order a pass over every key lists them in: from the buckets'
// lists when they are a few of many, so that a tally report's refresh
// reads its keys rather than every key's record.
func (s *State) refreshedKeys(r *Report) []*keyState {
	d := &s.delta
	d.refreshed = d.refreshed[:0]
	if r.RefreshCount >= RefreshBuckets/8 || s.buckets == nil { // sorting would cost more
		for i, ks := range s.keys {
			if inRange(uint32(s.meta[i].bucket), r.RefreshFrom, r.RefreshCount) {
				d.refreshed = append(d.refreshed, ks)
			}
		}
		return d.refreshed
	}
	s.eachRefreshed(r, func(ks *keyState) { d.refreshed = append(d.refreshed, ks) })
	slices.SortFunc(d.refreshed, func(a, b *keyState) int { return cmp.Compare(a.idx, b.idx) })
	return d.refreshed
}

// pruneGone forgets dropped keys listed in an earlier epoch by every stream
// that needed it, and keys held again.
func (s *State) pruneGone() {
	d := &s.delta
	live := d.gone[:0]
	for _, g := range d.gone {
		tallyDone := !g.tally || (g.tallyAt != 0 && g.tallyAt < s.epoch)
		exchDone := !g.exch || (g.exchAt != 0 && g.exchAt < s.epoch)
		kept := g.at+goneKeep >= s.epoch // for resends
		if (kept || !(tallyDone && exchDone)) && s.byKey[g.key] == nil {
			live = append(live, g)
		}
	}
	clear(d.gone[len(live):])
	d.gone = live
}

// noteGone records a key being dropped whose listings still stand.
func (s *State) noteGone(ks *keyState) {
	if s.cfg.Refresh < 0 || (ks.held == (tally{}) && ks.fp == 0) {
		return
	}
	s.delta.gone = append(s.delta.gone, goneKey{key: ks.key, tally: ks.held != (tally{}), exch: ks.fp != 0, at: s.epoch})
}

// reportList returns the keys the exchange report r lists: in a full report
// every key with something to report; in a delta, those whose entry changed
// since it was last listed, those whose news a peer has not acknowledged
// (gifts, reclaims, exit records, acknowledgements of a peer's), those
// whose demand moved in an epoch without a tally report, and those of the
// buckets r refreshes. A listed key without an entry any more is listed
// empty.
func (s *State) reportList(r *Report) []*keyState {
	list := s.delta.list[:0]
	if s.cfg.Refresh < 0 {
		for _, ks := range s.keys {
			if reported(ks) {
				list = append(list, ks)
			}
		}
		s.delta.list = list
		return list
	}
	d := &s.delta
	from := r.Resent
	// A key at rest has the entry it had when it was last listed, and no
	// news (restBlock): unless its bucket is refreshed, or everything
	// changed since an epoch is asked for, or this epoch's report was made
	// already (each key then as listed the first time), it is not listed.
	skip := from == 0 && d.reportedAt != s.epoch
	d.reportedAt = s.epoch
	for i, ks := range s.keys {
		m := &s.meta[i]
		if skip && m.rest == restOn && !inRange(uint32(m.bucket), r.RefreshFrom, r.RefreshCount) {
			continue
		}
		fp, rest := ks.fp, m.rest == restOn
		if !rest {
			fp = s.fingerprint(ks)
		}
		switch {
		case ks.fpAt == s.epoch, // the same epoch again
			fp != ks.fp,
			from != 0 && ks.fpAt >= from, // asked again
			fp != 0 && inRange(ks.bucket, r.RefreshFrom, r.RefreshCount),
			fp != 0 && !rest && s.epoch >= ks.fpAt+ackDue && s.unacknowledged(ks),
			ks.tallyAt == s.epoch && d.talliedAt != s.epoch: // one phase: no tally report carries it
		default:
			continue
		}
		ks.fp, ks.fpAt = fp, s.epoch
		list = append(list, ks)
	}
	d.fullReport, d.resendReport = false, 0
	d.list = list
	return list
}

// goneEntries adds to an exchange report the empty entries of keys dropped
// whose exchange state still stands at receivers.
func (s *State) goneEntries(r *Report) {
	for i := range s.delta.gone {
		g := &s.delta.gone[i]
		onePhase := g.tally && s.delta.talliedAt != s.epoch // no tally report says it
		if (g.exch || onePhase) && (g.exchAt == 0 || g.exchAt == s.epoch || r.Resent != 0 && g.at >= r.Resent) && s.byKey[g.key] == nil {
			g.exchAt = s.epoch
			if onePhase {
				g.tallyAt = s.epoch
			}
			r.Keys = append(r.Keys, KeyReport{Key: g.key, SharePPM: s.initial[s.self]})
		}
	}
	s.pruneGone()
}

// ackDue is how many epochs after a key's listing its news (a gift, a
// reclaim, an exit record) goes unacknowledged before the listing is
// repeated. A receiver acknowledges in its next exchange report, made as
// the sender makes its own next one: listing the news again there repeats
// what is on its way, a third of a share move's listings. A receiver that
// missed the listing asks for it in its next tally report, which the sender
// answers in that same next exchange report (lateRequests).
const ackDue = 2

// unacknowledged reports whether the key's entry carries news a peer has not
// confirmed: a gift or reclaim not acknowledged, an exit record announced,
// or an acknowledgement of a peer's exit records. Such keys are listed every
// epoch until it is confirmed, as a full report would.
func (s *State) unacknowledged(ks *keyState) bool {
	return ks.announcing != 0 || (len(ks.exits) > 0 && (ks.gen == 0 || ks.applied >= 0)) || (ks.gen != 0 && !s.settled(ks))
}

// fingerprint hashes what the key's exchange report entry says, except its
// tallies (the tally report carries those): 0 when it has no entry.
func (s *State) fingerprint(ks *keyState) uint64 {
	if !reported(ks) {
		return 0
	}
	h := fnv{0xcbf29ce484222325}
	h.add(ks.gen)
	h.add(uint64(s.shareOf(ks)))
	if ks.gen != 0 {
		h.add(uint64(s.effectiveBase(ks)))
		h.row(s.ownRow(ks))
		h.row(s.ownTaken(ks))
		h.row(ks.in())
		h.row(ks.inTakenStored())
		h.row(ks.tok())
		h.add(uint64(ks.tokWin))
	}
	if ks.announcing != 0 {
		for _, v := range ks.settled() {
			h.add(v)
		}
	}
	if ks.gen == 0 || ks.applied >= 0 { // keyReport announces exits only then
		for _, x := range ks.exits {
			h.add(x.gen)
			h.row(x.row)
			h.row(x.taken)
			h.row(x.in)
			h.row(x.intake)
		}
	}
	if h.v == 0 {
		return 1 // 0 means no entry
	}
	return h.v
}

// fnv is FNV-1a over 64-bit words, finished by a shift: not cryptographic,
// only a change detector whose misses the refresh repairs.
type fnv struct{ v uint64 }

func (h *fnv) add(x uint64) {
	h.v = (h.v ^ x) * 0x100000001b3
	h.v ^= h.v >> 29
}

func (h *fnv) row(v []int64) {
	h.add(uint64(len(v)))
	for _, x := range v {
		h.add(uint64(x))
	}
}

// watchStream is noteStream for a replica that does not merge reports.
func (s *State) watchStream(r *Report) {
	if k, ok := s.index[r.Region]; ok && r.Since <= r.Epoch {
		s.noteStream(k, r)
		s.asked(r)
	}
}

// noteStream notes the stream of an exchange report from region k, for any
// replica, holder or not: a holder that started a new stream knows nothing
// of ours, so our next reports of both kinds are full.
func (s *State) noteStream(k int, r *Report) {
	if !r.Exchange || r.Refresh == 0 || k == s.self && r.Replica == s.cfg.Replica {
		return
	}
	if s.delta.streams == nil {
		s.delta.streams = make([]uint64, s.n)
	}
	if r.Since <= s.delta.streams[k] {
		return
	}
	s.delta.streams[k] = r.Since
	// A stream that started after ours missed our full report.
	d := &s.delta
	if d.tallySince != 0 && d.tallySince <= r.Since {
		d.fullTally = true
	}
	if d.reportSince != 0 && d.reportSince <= r.Since {
		d.fullReport = true
	}
}

// covered is, per region, the refresh buckets its current exchange stream
// has refreshed in a report received: a key of such a bucket that the
// stream does not list has no state there, while one of a bucket not yet
// refreshed is unknown (a new stream whose full report was lost).
type covered [RefreshBuckets / 64]uint64

func (c *covered) set(from, count uint32) {
	if count >= RefreshBuckets {
		for i := range c {
			c[i] = ^uint64(0)
		}
		return
	}
	for i := uint32(0); i < count; i++ {
		b := (from + i) % RefreshBuckets
		c[b/64] |= 1 << (b % 64)
	}
}

func (c *covered) has(b uint32) bool { return c[b/64]&(1<<(b%64)) != 0 }

// refreshed takes what a delta report from peer k (slot: its replica) says
// of the keys it leaves out of the buckets it refreshes: a tally report,
// that they have no demand at that replica; an exchange report, that they
// have no state at k.
func (s *State) refreshed(r *Report, in *inbound) {
	if r.Refresh == 0 || r.RefreshCount == 0 {
		return
	}
	k := in.k
	s.eachRefreshed(r, func(ks *keyState) {
		s.touch(ks)
		if !r.Exchange { // an exchange report's buckets say nothing of demand without state
			for i := range ks.tallies {
				if e := &ks.tallies[i]; e.slot == in.slot && e.inc == in.inc && e.epoch < r.Epoch {
					e.epoch, e.demand, e.granted = r.Epoch, 0, 0
				}
			}
		}
		if in.exchange && ks.seen()[k] != r.Epoch {
			ks.seen()[k], ks.cur()[k], ks.shares()[k] = r.Epoch, 0, s.initial[k]
			ks.announcing &^= 1 << k
		}
	})
	if in.exchange {
		s.cover[k].set(r.RefreshFrom, r.RefreshCount)
	}
}

// eachRefreshed calls f for every key of the buckets r refreshes.
func (s *State) eachRefreshed(r *Report, f func(*keyState)) {
	if r.RefreshCount == 0 || s.buckets == nil {
		return
	}
	for i := uint32(0); i < min(r.RefreshCount, RefreshBuckets); i++ {
		for _, ks := range s.buckets[(r.RefreshFrom+i)%RefreshBuckets] {
			f(ks)
		}
	}
}
