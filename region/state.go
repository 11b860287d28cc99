package region

import (
	"slices"
	"time"
)

// State is one region's exchange state for all its active global keys: the
// synchronous core of DESIGN.md "Level 2". It does no I/O, starts no
// goroutine and reads no clock; every method that needs the time takes it.
//
// The zero value is not usable; call New. A State is not safe for concurrent
// use: one goroutine (regiond's sync loop, or the simulator) owns it.
type State struct {
	cfg       Config
	periodSec float64 // cfg.Period.Seconds(), which divides, asked per key and region
	n, self   int
	index     map[string]int
	identity  []int   // columns mapping for reports with our own region list
	initial   []int64 // initial share per region

	keys  []*keyState
	meta  []keyMeta // beside keys (rest.go)
	byKey map[string]*keyState
	// buckets are the keys of each refresh bucket (delta.go), so that a
	// report's refresh visits its buckets' keys only.
	buckets [][]*keyState

	now      time.Time
	epoch    uint64
	genFloor uint64 // highest generation left by a key whose state was dropped
	store    string // the store's incarnation last seen (SawStore); "" none yet

	seq       uint64 // sequence of the latest Plan
	committed bool   // the latest Plan was committed
	restored  bool   // Restore ran since the last Epoch
	// tallied: Tally closed this epoch's tallies; the next Epoch steers by
	// them and keeps the epoch number (the two phases of an epoch).
	tallied bool
	// tallyGen counts the closings of the local tallies (from 1): a key's
	// open tally (keyState.cur0) counts only if observed in the current one
	// (keyState.curAt), so that closing leaves steady keys alone.
	tallyGen uint64
	// closedAt is the epoch the local tallies last closed in (0: none
	// since the State began): an epoch that starts late (its predecessor
	// outlasted the period) closes tallies of more than one period, which
	// closing divides by tallySpan (tally.per) so that they stay per epoch.
	closedAt uint64
	open     []step // the latest Plan's steps, to distrust them if not committed

	replicas  []replica
	replicaBy map[string]int

	toApply []*keyState // keys whose share may have risen since Apply

	exchEpoch []uint64    // per region: epoch of its latest exchange report
	exchHeard []time.Time // per region: when that report was received
	// Per region, of its latest exchange report: the start of its stream
	// (streamSince) and its Refresh, which say how long a listing stands.
	exchSince   []uint64
	exchRefresh []uint32
	cover       []covered // per region: the buckets its stream refreshed (delta.go)

	delta deltas // our own streams of reports

	// Keys at rest (rest.go): the signature of what every key's epoch
	// reads (calm) at the latest Epoch, that Epoch's time, and the count of
	// PolicyChanged calls.
	calmSig   uint64
	prevNow   time.Time
	policyGen uint64
	resting   int    // keys the latest Epoch skipped
	heardOnly bool   // the key epochKey ran had demand only in a replaced tally (noteRest)
	awake     Awake  // why the latest Epoch visited keys and kept them awake
	epochs    uint64 // Epoch calls completed

	saved saveState // what of the state is persisted (saved.go)

	// Rule definitions (rules.go): ours as of the latest Epoch, the rules
	// a replica heard defines otherwise, and a counter of their changes.
	ownPolicy   string
	ownRules    map[string]RuleDef
	disagree    map[string]*Disagreement
	disagreeGen uint64
	agreeLatest []int  // scratch of agree
	agreeRecent []bool // scratch of agree

	// scratch space for Epoch and Receive
	tg       targeter
	recvKS   []*keyState
	x        []float64
	fresh    []bool // per region, for the key at hand: its demand is current
	heardNow []bool // per region: some replica of it heard within StaleAfter
	heardEp  []bool // per region: heard(now) at the Epoch running, for its keys (epochKeys)
	v, t     []int64
	live     []int
	recv     []bool // per region: a live peer in our generation, which can receive gifts
	need     []float64
	bare     []float64 // need without the noise headroom (transfers.go)
	bareTg   targeter  // targets of bare (transfers.go)
	headroom bool      // some need of the key at hand has headroom: bare differs
	weights  []int64
	lt       []int64
	gifts    []int64
	kept     []bool
	slab     []int64   // rows of plan steps are carved from it (see rowBuf)
	pol      KeyPolicy // the policy of the key epochKey ran last
	restE    []float64 // scratch of rest.go
	restM    []float64
	restIn   []int64 // scratch of restSig
	// sizes are the latest Plan's and tally report's lengths, to size the
	// next ones' slices at once.
	sizes struct{ steps, lower, raise, tally int }
}

// keyState is the exchange state of one key in this region.
type keyState struct {
	key string
	gen uint64 // 0: no exchange state (new, or retired and announcing its exit)
	// floor is the highest generation we left for this key: we never
	// enter one at or below it (nor at or below State.genFloor).
	floor uint64
	base  int64 // our share when we entered gen
	// applied is the share the store holds for the key as far as we know,
	// or -1 when we do not know (a new or restored key, or a plan that was
	// not committed): the next plan then writes it before any gift.
	applied int64

	// Per-region arrays (keyarrays.go: rows, taken, bases, in, ... ewma),
	// carved from one allocation free of pointers, so that the garbage
	// collector follows one pointer of a key's state rather than one per
	// array.
	ints    []int64
	unheard uint64 // regions not heard at the last epoch: their EWMA restarts
	// Per region: its EWMA has moved, last moved up, and turned at the
	// last move.
	moved, rose, flipped uint64

	// Tokens escrowed with share (tokens.go), in TokenScale units: tok()[j]
	// is what we gave j in gen and fixed window tokWin (our row), tokIn()[k]
	// what k gave us in gen and window tokInWin()[k]; tokCredited is the Σ
	// tokIn of window tokCreditedWin our store confirmed crediting. For a
	// token bucket every window is 0.
	tokWin                      int64
	tokCredited, tokCreditedWin int64

	exits []*exitState // generations we left and still announce, oldest first
	// settled()[k] is the newest generation of k's exit records we have
	// settled against; announcing is the mask of peers whose latest report
	// still carried exit records, to which we acknowledge.
	announcing uint64

	cur0, pub tally  // local tallies: since the last epoch (State.cur), and closed at it
	curAt     uint64 // the State.tallyGen cur0 was observed in
	// held is the tally last published, which every region steers by: pub
	// when it moved beyond noise (closeTally). tallyAt is the epoch of the
	// tally report that last listed the key; fp and fpAt are the
	// fingerprint of the exchange entry last listed and its epoch.
	held tally
	// up and down are hold's CUSUM of the tallies closed since held was
	// published; run are the tallies of the shift it follows, all every
	// tally since.
	up, down float32
	run, all tallySum
	bucket   uint32 // RefreshBucket(key)
	bpos     int32  // its index in State.buckets[bucket]
	tallyAt  uint64
	fp, fpAt uint64
	tallies  []tallyEntry
	// tallyRoom holds tallies while they fit (the peers' single replicas
	// of three regions): not an object of its own for the garbage
	// collector to mark, nor another place for an epoch to miss in cache.
	// A keyState is never copied, so tallies never points into another's.
	tallyRoom [2]tallyEntry

	created, lastDemand, lastTransfer time.Time
	written                           time.Time // the latest confirmed write of its share (Wrote)

	toApply bool // in State.toApply
	// heardDemand: a peer's tally listed demand for the key since its last
	// epoch, in a report a newer one may have replaced before that epoch
	// read it (epochKey).
	heardDemand bool
	n           uint8 // regions: the arrays' (ints) shape

	// At rest (rest.go): quiet epochs running (restQuiet: resting), and
	// whether it had demand when it came to rest; its timers are in
	// State.meta.
	quiet      uint8
	restActive bool
	// unsaved: its persisted record may have changed (saved.go);
	// inStore: the saved snapshot holds it.
	unsaved, inStore bool
	idx              int32  // its index in State.keys and State.meta
	visit            uint64 // the epoch its state is current in, counted from 1 (0: none yet)
}

// exitState is our final state in a generation we left.
type exitState struct {
	gen                    uint64
	row, taken, in, intake []int64
	refund                 []int64 // refunds already added to base for it
	ack                    []int64 // our gifts there that each peer acknowledged
	dropped                []int64 // reclaims not acknowledged, given up when we left
	at                     time.Time
	acked                  uint64 // peers that acknowledged settling against this record
}

type tally struct{ demand, granted int64 }

// per is t, counted over span epochs, per epoch: rounded half up, and at
// least 1 where t has any (demand that appeared does not vanish).
func (t tally) per(span int64) tally {
	if span <= 1 {
		return t
	}
	div := func(v int64) int64 {
		if v <= 0 {
			return v
		}
		return max(1, (v+span/2)/span)
	}
	return tally{div(t.demand), div(t.granted)}
}

// tallyEntry is the latest tally of one peer replica for one key. It counts
// only while it is from that replica's latest report (a replica that stops
// listing a key has no demand for it) and the replica was heard lately.
type tallyEntry struct {
	slot            int32
	inc             uint32
	epoch           uint64
	demand, granted int64
}

// streamPos is the latest report received of a stream of deltas.
type streamPos struct{ since, epoch uint64 }

// replica is a peer replica (of any region, ours included) that sent
// reports; inc tells a reused slot from its previous owner.
type replica struct {
	region    int
	name      string
	inc       uint32
	live      bool
	lastEpoch uint64 // newest epoch of any report of it
	lastTally uint64 // newest epoch of its tally-only reports
	lastExch  uint64 // newest epoch of its exchange reports
	lastHeard time.Time
	// since is the start of its stream of reports (streamSince): its tally
	// entries made before stand no more.
	since uint64
	// streamTally and streamExch are where its streams of deltas stand,
	// and want the first epoch of each (tally, exchange) we missed and
	// ask for again (0: none).
	streamTally, streamExch streamPos
	want                    [2]uint64
	// policy and rules are its latest report's Policy and Rules (rules.go).
	policy string
	rules  []RuleDef
}

// New returns the exchange state of region cfg.Self with no active key. The
// error wraps ErrInvalidConfig.
func New(cfg Config) (*State, error) {
	c := cfg.withDefaults()
	initial, err := c.initialShares()
	if err != nil {
		return nil, err
	}
	n := len(c.Regions)
	s := &State{
		cfg:         c,
		periodSec:   c.Period.Seconds(),
		n:           n,
		index:       make(map[string]int, n),
		identity:    make([]int, n),
		initial:     initial,
		byKey:       make(map[string]*keyState),
		replicaBy:   make(map[string]int),
		exchEpoch:   make([]uint64, n),
		exchHeard:   make([]time.Time, n),
		exchSince:   make([]uint64, n),
		exchRefresh: make([]uint32, n),
		cover:       make([]covered, n),
		tallyGen:    1,
		x:           make([]float64, n),
		fresh:       make([]bool, n),
		recv:        make([]bool, n),
		heardNow:    make([]bool, n),
		heardEp:     make([]bool, n),
		v:           make([]int64, n),
		t:           make([]int64, n),
		need:        make([]float64, 0, n),
		bare:        make([]float64, 0, n),
		weights:     make([]int64, 0, n),
		lt:          make([]int64, n),
		gifts:       make([]int64, n),
	}
	for i, r := range c.Regions {
		s.index[r] = i
		s.identity[i] = i
	}
	s.self = s.index[c.Self]
	s.restartStreams()
	return s, nil
}

// Config returns the configuration in force, defaults filled.
func (s *State) Config() Config { return s.cfg }

// Initial returns the initial share of region in ppm (0 for a region not in
// Config.Regions): the share the store uses for a key without an applied
// share.
func (s *State) Initial(region string) int64 {
	if i, ok := s.index[region]; ok {
		return s.initial[i]
	}
	return 0
}

// Observe adds local tallies of key since the last epoch: demand is the
// tokens asked for (admitted or not), granted the tokens granted. Calls are
// summed. Negative values count as zero; an empty key is ignored. Only
// `scope: global` keys are observed: `scope: region` keys are never
// exchanged.
func (s *State) Observe(key string, demand, granted int64) {
	if key == "" || (demand <= 0 && granted <= 0) {
		return
	}
	ks := s.byKey[key]
	if ks == nil {
		ks = s.addKey(key)
	}
	if ks.curAt != s.tallyGen { // the first call since the tallies closed
		ks.cur0, ks.curAt = tally{}, s.tallyGen
	}
	if demand > 0 {
		ks.cur0.demand += demand
	}
	if granted > 0 {
		ks.cur0.granted += granted
	}
	// Mark a key whose tally, as it stands, closes to what it published
	// last: Tally need not visit it. Unmarked, it holds a generation past,
	// which no Tally compares with again.
	g := uint32(s.tallyGen)
	if ks.cur0 != ks.pub || ks.pub != ks.held || ks.pub == (tally{}) {
		g--
	}
	m := &s.meta[ks.idx]
	m.sameAt, m.idle = g, false
}

// cur returns ks's open tally: what was observed since the tallies last
// closed.
func (s *State) cur(ks *keyState) tally {
	if ks.curAt != s.tallyGen {
		return tally{}
	}
	return ks.cur0
}

// closeTallies starts a new open tally for every key (State.cur).
func (s *State) closeTallies() {
	s.tallyGen++
	s.closedAt = s.epoch
}

// tallySpan is the epochs the open tally covers, once advance numbered the
// epoch that closes it.
func (s *State) tallySpan() int64 {
	if s.closedAt == 0 {
		return 1
	}
	return int64(s.epoch - s.closedAt)
}

// closing returns ks's open tally as it closes: per epoch (tallySpan).
func (s *State) closing(ks *keyState) tally { return s.cur(ks).per(s.tallySpan()) }

// Share returns the share of key in ppm that this region applies: the value
// last committed to the store, or, for a key whose stored value is not known
// (just created or restored), the value the next Epoch will write. A key
// without exchange state has the region's initial share.
func (s *State) Share(key string) int64 { return s.shareOf(s.byKey[key]) }

// shareOf is Share for a key's state (nil: none).
func (s *State) shareOf(ks *keyState) int64 {
	switch {
	case ks == nil || ks.gen == 0:
		return s.initial[s.self]
	case ks.applied >= 0:
		return ks.applied
	default:
		return clamp(s.own(ks), 0, PPM)
	}
}

// Keys returns the number of keys the State holds (active keys, and retired
// ones still announcing their exit). Memory follows it.
func (s *State) Keys() int { return len(s.keys) }

// Resync makes the next Epoch write key's share to the store again, before
// any gift: call it when a write of the key's share may have failed (a Raise
// or Retire entry), so that the store converges on the State.
func (s *State) Resync(key string) {
	if ks := s.byKey[key]; ks != nil {
		ks.applied = -1
		s.touch(ks)
	}
}

// ResyncAll is Resync for every key: call it when the store may have lost
// writes (a Redis failover or restart, lease's Incarnation changed), since
// a lost write of a lowered share brings share we gave away back into the
// store, where nothing else would ever lower it again.
func (s *State) ResyncAll() {
	for _, ks := range s.keys {
		ks.applied = -1
		s.touch(ks)
	}
}

// SawStore notes the store's incarnation (lease's Incarnation), read before
// an Epoch; it calls ResyncAll and reports true when that changed since the
// one last noted, so that this Epoch writes every share again before it
// gives anything. The first incarnation noted only sets the baseline (a new
// or restored State writes every share anyway). It is not persisted.
func (s *State) SawStore(incarnation string) bool {
	changed := s.store != "" && incarnation != s.store
	if changed {
		s.ResyncAll()
	}
	s.store = incarnation
	return changed
}

// LastEpoch is the number of the latest epoch decided (or restored).
func (s *State) LastEpoch() uint64 { return s.epoch }

func (s *State) addKey(key string) *keyState {
	n := s.n
	ks := &keyState{
		key:     key,
		bucket:  RefreshBucket(key),
		applied: -1,
		ints:    make([]int64, arraysLen(n)),
		n:       uint8(n),
	}
	copy(ks.born(), s.exchEpoch)
	if !s.now.IsZero() {
		ks.created, ks.lastDemand, ks.lastTransfer = s.now, s.now, s.now
	}
	s.byKey[key] = ks
	ks.idx = int32(len(s.keys))
	s.keys = append(s.keys, ks)
	s.meta = append(s.meta, keyMeta{bucket: uint16(ks.bucket)})
	if s.buckets == nil {
		s.buckets = make([][]*keyState, RefreshBuckets)
	}
	ks.bpos = int32(len(s.buckets[ks.bucket]))
	s.buckets[ks.bucket] = append(s.buckets[ks.bucket], ks)
	return ks
}

// holds reports whether ks is the state held for its key (not dropped
// since): what s.byKey[ks.key] == ks says, without hashing the key.
func (s *State) holds(ks *keyState) bool {
	return int(ks.idx) < len(s.keys) && s.keys[ks.idx] == ks
}

// removeKey drops s.keys[i], moving the last key into its place.
func (s *State) removeKey(i int) {
	ks := s.keys[i]
	if ks.inStore {
		s.saved.removed = append(s.saved.removed, ks.key)
	}
	s.genFloor = max(s.genFloor, ks.floor) // the key's own floor is forgotten now
	delete(s.byKey, ks.key)
	s.noteGone(ks)
	last := len(s.keys) - 1
	s.keys[i] = s.keys[last]
	s.keys[i].idx = int32(i)
	s.keys[last] = nil
	s.keys = s.keys[:last]
	s.meta[i] = s.meta[last]
	s.meta = s.meta[:last]
	b := s.buckets[ks.bucket]
	end := len(b) - 1
	b[ks.bpos] = b[end]
	b[ks.bpos].bpos = ks.bpos
	b[end] = nil
	s.buckets[ks.bucket] = b[:end]
}

// ownRow returns our row of gifts in the key's generation.
func (s *State) ownRow(ks *keyState) []int64 { return ks.rows()[s.self*s.n : (s.self+1)*s.n] }

// ownTaken returns our row of reclaims in the key's generation.
func (s *State) ownTaken(ks *keyState) []int64 { return ks.taken()[s.self*s.n : (s.self+1)*s.n] }

// own computes our share of a key from counters we know. Our own row is
// exact and the gifts to us can only be behind, so this is never above our
// true share (DESIGN.md, "Level 2").
func (s *State) own(ks *keyState) int64 {
	sh := ks.base
	row, tk := s.ownRow(ks), s.ownTaken(ks)
	for j := 0; j < s.n; j++ {
		sh += ks.in()[j] - row[j] + tk[j] - ks.inTaken()[j] + ks.refund()[j] - ks.unclaim()[j]
	}
	return sh
}

// effectiveBase is the base we report: it includes what we took back from,
// or gave up to, peers that left the generation, which our rows do not
// show, so that peers' views of our share are right.
func (s *State) effectiveBase(ks *keyState) int64 {
	b := ks.base
	for j := 0; j < s.n; j++ {
		b += ks.refund()[j] - ks.unclaim()[j]
	}
	return clamp(b, -PPM, PPM)
}

// view estimates the share of peer k, which is in our generation, from the
// rows we know. Views only steer targets; safety never depends on them.
func (s *State) view(ks *keyState, k int) int64 {
	n := s.n
	v := ks.bases()[k]
	for j := 0; j < n; j++ {
		if j == s.self || ks.rowGen()[j] == ks.gen {
			v += ks.rows()[j*n+k] - ks.taken()[j*n+k]
		}
	}
	for j := 0; j < n; j++ {
		v += ks.taken()[k*n+j] - ks.rows()[k*n+j]
	}
	return v
}

// peerGen returns the generation peer k is in for the key as of its latest
// exchange report (0: none, or unknown).
func (s *State) peerGen(ks *keyState, k int) uint64 {
	if !s.listed(ks, k) {
		return 0
	}
	return ks.cur()[k]
}

// listed reports whether peer k's listing of the key in its exchange
// reports stands: made in its current stream (in a full one, its latest
// report). A listing may say the key has no state there.
func (s *State) listed(ks *keyState, k int) bool {
	return s.exchEpoch[k] != 0 && ks.seen()[k] != 0 && ks.seen()[k] >= s.exchSince[k]
}

// known reports whether we know peer k's state for the key: it listed the
// key, or an exchange report of it arrived since we track the key (one that
// does not list it says it has no state).
func (s *State) known(ks *keyState, k int) bool {
	if s.exchRefresh[k] == 0 {
		return ks.seen()[k] != 0 || s.exchEpoch[k] > ks.born()[k]
	}
	// A stream of deltas: listed in it, or its bucket refreshed in it.
	return s.listed(ks, k) || s.cover[k].has(ks.bucket)
}

// highestPeerGen returns the newest generation a peer is in for the key.
func (s *State) highestPeerGen(ks *keyState) uint64 {
	var g uint64
	for k := 0; k < s.n; k++ {
		if k != s.self {
			g = max(g, s.peerGen(ks, k))
		}
	}
	return g
}

// setTally records the tallies of a peer replica's report for a key. A
// replica's tally-only and exchange reports of one epoch carry the same
// tallies; an older report (reordered) never replaces a newer one.
func (ks *keyState) setTally(slot int32, inc uint32, epoch uint64, demand, granted int64) {
	for i := range ks.tallies {
		if e := &ks.tallies[i]; e.slot == slot {
			if e.inc == inc && e.epoch > epoch {
				return
			}
			*e = tallyEntry{slot, inc, epoch, demand, granted}
			return
		}
	}
	if demand == 0 && granted == 0 {
		return
	}
	if ks.tallies == nil {
		ks.tallies = ks.tallyRoom[:0]
	}
	ks.tallies = append(ks.tallies, tallyEntry{slot, inc, epoch, demand, granted})
}

// demands fills s.x with the latest demand of every region for the key:
// ours is the tally we published at the last epoch (so that every region
// steers by the same numbers), plus other replicas of our region.
func (s *State) demands(ks *keyState, now time.Time) {
	for k := range s.x {
		s.x[k] = 0
	}
	copy(s.fresh, s.heardNow)
	s.x[s.self] = float64(ks.held.demand)
	live := ks.tallies[:0]
	for _, e := range ks.tallies {
		r := &s.replicas[e.slot]
		if !r.live || r.inc != e.inc {
			continue // the replica is gone: forget its entry
		}
		live = append(live, e)
		if e.epoch >= r.since && now.Sub(r.lastHeard) <= s.cfg.StaleAfter {
			s.x[r.region] += float64(e.demand)
		}
	}
	clear(ks.tallies[len(live):])
	ks.tallies = live
}

// pruneReplicas forgets replicas not heard for long, so that restarts with
// new replica names do not grow the table forever, and notes which regions
// a replica of was heard lately (their tallies are current: a key they do
// not list has no demand there).
func (s *State) pruneReplicas(now time.Time) {
	forget := s.cfg.IdleAfter + 10*s.cfg.StaleAfter
	for k := range s.heardNow {
		s.heardNow[k] = k == s.self
	}
	for i := range s.replicas {
		r := &s.replicas[i]
		if r.live && now.Sub(r.lastHeard) <= s.cfg.StaleAfter {
			s.heardNow[r.region] = true
		}
		if r.live && now.Sub(r.lastHeard) > forget {
			delete(s.replicaBy, replicaKey(s.cfg.Regions[r.region], r.name))
			r.live = false
			r.inc++
		}
	}
}

func replicaKey(region, replica string) string { return region + "\x00" + replica }

// slotFor returns the slot of a replica, making one.
func (s *State) slotFor(region int, name string) int32 {
	key := replicaKey(s.cfg.Regions[region], name)
	if i, ok := s.replicaBy[key]; ok {
		return int32(i)
	}
	i := slices.IndexFunc(s.replicas, func(r replica) bool { return !r.live })
	if i < 0 {
		i = len(s.replicas)
		s.replicas = append(s.replicas, replica{})
	}
	r := &s.replicas[i]
	r.region, r.name, r.live, r.lastEpoch, r.lastTally, r.lastExch = region, name, true, 0, 0, 0
	r.since, r.streamTally, r.streamExch, r.want = 0, streamPos{}, streamPos{}, [2]uint64{}
	s.replicaBy[key] = i
	return int32(i)
}

func clamp(v, lo, hi int64) int64 { return min(max(v, lo), hi) }
