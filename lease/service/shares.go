package service

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ration-dev/ration/lease"
)

// Kept raises (issue 13). The exchange writes a key's applied share whenever
// its target moves: for a long tail of keys asked a few times a minute, each
// ask moves the key's share towards the region that asked and back (per-user:
// 1.17 store operations per admitted request were share writes). A raise
// only lets the bucket grant more, so the store may hold a lower share than
// the exchange counts as applied, never a higher one: a ShareKeeper keeps
// every raise of a token bucket whose store share it knows, and the key's
// next grant carries it (lease.GrantRequest.Raise) with its age, so that the
// store applies it as a write would have when the exchange made it: the
// bucket refills at the raised share since then. No grant sees less than a
// write at once would have given, and a raise costs no store operation.
// (Until 3 December 2026 the keeper wrote the raises of keys that grants
// found short, 37,800 writes in per-user, and kept only those of keys with
// plenty, written unaged once the key ran short.)
//
// What the keeper knows of the store's share of a key comes only from its
// own writes since Reset: the caller resets it when another replica may have
// written or granted (it takes the exchange over) and the keeper resets
// itself when the store's incarnation changes (SawIncarnation). It keeps no
// raise while the caller says another replica of the region serves agents
// (KeepRaises), whose grants it cannot see. A share it wrote longer ago than
// MaxKeep is written again, so that the store's share lives (its ShareTTL)
// as long as the exchange's rewrites (region.Config.Rewrite) expect. Tokens
// received with a kept raise are credited when it is written: the update
// carries the cumulative tokens of its generation, which the store credits
// once.
//
// Initial shares (issue 12). The exchange writes a key's share when the key
// enters a generation, because it cannot know what the store holds: half of
// per-user's share writes set the initial share, with no tokens, on a key
// whose store held none. A grant reports the share in force, so the keeper
// notes, per key granted lately, a grant that found the initial share in
// force; such an update is not written (shareSame). Only a grant that no
// write of the keeper overlapped counts, and every write or Forget of a key
// drops what grants told of its share: a write that failed may have
// happened. A store that holds the initial share, or none, keeps applying
// it whatever expires, so the note stays true until a write.

// ShareWrite writes share updates to the region's store, one result each
// (lease.RedisStore's and lease.MemoryStore's SetShares).
type ShareWrite func(ctx context.Context, ups []lease.ShareUpdate, out []lease.ShareResult) error

// ShareKeeperConfig configures a ShareKeeper.
type ShareKeeperConfig struct {
	// Store is the region's allocator; the keeper passes grants and returns
	// through to it, with the raises it kept. Required.
	Store Store
	// Clock is the keeper's time. Default time.Now.
	Clock func() time.Time
	// Quiet is how long the keeper remembers the share a key's latest grant
	// found in force, once the table of keys granted is full (MaxKeys).
	// Default 60s.
	Quiet time.Duration
	// MaxKeep is how old the keeper's latest write of a key's share may be
	// for a raise of it to be kept. Default 1h.
	MaxKeep time.Duration
	// Write, when set, is how the keeper writes a deferred update itself
	// (deferred.go), before the first grant or return of its key; nil
	// defers nothing. The exchange's own writes go through SetShares's.
	Write ShareWrite
	// FlushBatch is the most kept raises one call writes (Flush, or added
	// to a SetShares); the rest wait for the next. Default 500.
	FlushBatch int
	// MaxKeys bounds the keys whose grants are remembered; beyond it the
	// keeper forgets those older than Quiet, or all. Default 1<<20.
	MaxKeys int
}

// ErrShareKeeperConfig is wrapped by NewShareKeeper's errors.
var ErrShareKeeperConfig = errors.New("service: invalid share keeper config")

func (c ShareKeeperConfig) withDefaults() ShareKeeperConfig {
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Quiet == 0 {
		c.Quiet = time.Minute
	}
	if c.MaxKeep == 0 {
		c.MaxKeep = time.Hour
	}
	if c.FlushBatch == 0 {
		c.FlushBatch = 500
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = 1 << 20
	}
	return c
}

// ShareKeeper is the region's store as the lease service grants from it and
// the exchange writes shares to it, keeping the raises of keys that do not
// need them. Safe for concurrent use.
type ShareKeeper struct {
	cfg ShareKeeperConfig

	mu sync.Mutex
	// written is the share of each key the store holds, as the keeper last
	// wrote it; pending the raises kept, for the key's next grant to carry;
	// due those to write at the next call, as raises may not be kept.
	written map[string]wrote
	pending map[string]kept
	due     map[string]struct{}
	// deferred are the updates of keys whose store share is not known,
	// written before the key's next grant or return; settling those being
	// written, closed when done.
	deferred map[string]lease.ShareUpdate
	settling map[string]chan struct{}
	// carrying are the keys whose kept raise a grant carries (carry.go),
	// closed when it lands.
	carrying map[string]chan struct{}
	// doubt is, per key whose latest write failed, the largest share
	// written since its latest success: the store may hold it.
	doubt map[string]int64
	// seen is, per key granted lately, what its grants told.
	seen   map[string]granted
	keep   bool
	inc    string
	counts ShareCounts
	// wseq counts the starts and ends of writes, Forgets and Resets, and
	// writing the writes under way: a grant's share is noted only when
	// neither changed while it ran and no write was under way.
	wseq    uint64
	writing int
}

type wrote struct{ ppm, at int64 }

// kept is a raise kept, and the shares the exchange set since the store's
// (steps: the last is u's), with when (Clock ns).
type kept struct {
	u     lease.ShareUpdate
	steps []keptStep
}

type keptStep struct{ ppm, at int64 }

// then returns p with u, set at now, as its newest step. Beyond
// lease.MaxRaiseSteps the two oldest steps merge into the smaller share
// from the older's time: the store then refills less than the exchange
// allowed, never more.
func (p kept) then(u lease.ShareUpdate, now int64) kept {
	steps := append(p.steps, keptStep{ppm: u.SharePPM, at: now})
	if len(steps) > lease.MaxRaiseSteps {
		steps[1] = keptStep{ppm: min(steps[0].ppm, steps[1].ppm), at: steps[0].at}
		steps = steps[1:]
	}
	return kept{u: u, steps: steps}
}

// stepsAt is p's steps as the store takes them at now (Clock ns).
func (p kept) stepsAt(now int64) []lease.ShareStep {
	steps := make([]lease.ShareStep, len(p.steps))
	for j, st := range p.steps {
		steps[j] = lease.ShareStep{SharePPM: st.ppm, Age: min(max(time.Duration(now-st.at), 0), lease.MaxRaiseAge)}
	}
	return steps
}

// carrySteps sets on u, about to be written, the steps of its key's kept
// raise: the store then refills at them over the time each was in force
// (k.mu held).
func (k *ShareKeeper) carrySteps(u *lease.ShareUpdate, now int64) {
	if p, ok := k.pending[u.Key]; ok && !u.Limit.Fixed() && len(u.Steps) == 0 {
		u.Steps = p.stepsAt(now)
	}
}

// granted is what grants told of a key: when the latest was (Clock ns),
// and the share in force of the latest grant no write overlapped (-1: none
// since the key's latest write).
type granted struct {
	at, share int64
}

// NewShareKeeper returns a ShareKeeper for cfg, filling its defaults on a
// copy; it keeps raises until KeepRaises(false).
func NewShareKeeper(cfg ShareKeeperConfig) (*ShareKeeper, error) {
	cfg = cfg.withDefaults()
	switch {
	case cfg.Store == nil:
		return nil, errors.Join(ErrShareKeeperConfig, errors.New("Store is required"))
	case cfg.Quiet < 0 || cfg.MaxKeep < 0 || cfg.MaxKeys < 0 || cfg.FlushBatch < 0:
		return nil, errors.Join(ErrShareKeeperConfig, errors.New("Quiet, MaxKeep, MaxKeys and FlushBatch must not be negative"))
	}
	return &ShareKeeper{cfg: cfg, written: map[string]wrote{}, pending: map[string]kept{},
		due: map[string]struct{}{}, seen: map[string]granted{}, keep: true,
		deferred: map[string]lease.ShareUpdate{}, settling: map[string]chan struct{}{}, carrying: map[string]chan struct{}{}, doubt: map[string]int64{}}, nil
}

// Grant grants from the store, each item carrying what the keeper kept or
// deferred of its key (carry.go), and notes the shares the grants found.
func (k *ShareKeeper) Grant(ctx context.Context, reqs []lease.GrantRequest, out []lease.Grant) error {
	caps, err := k.settle(ctx, len(reqs), func(i int) string { return reqs[i].Key }, true)
	if err != nil {
		return err
	}
	now := k.cfg.Clock().UnixNano()
	k.mu.Lock()
	raises := k.takeRaises(reqs, caps)
	seq, clean := k.wseq, k.writing == 0
	k.mu.Unlock()
	reqs = carry(reqs, caps, raises, now)
	err = k.cfg.Store.Grant(ctx, reqs, out)
	k.landCaps(caps, reqs, out, err)
	k.landRaises(raises, reqs, out, err)
	if err != nil {
		return err
	}
	now = k.cfg.Clock().UnixNano()
	k.mu.Lock()
	defer k.mu.Unlock()
	clean = clean && k.writing == 0 && k.wseq == seq
	for i := range reqs {
		g := &out[i]
		if g.Err != nil || reqs[i].Limit.Fixed() {
			continue
		}
		share := int64(-1)
		if clean {
			share = g.SharePPM
		}
		k.sawGrant(reqs[i].Key, share, now)
	}
	return nil
}

// sawGrant notes a grant of key at now that found share in force (-1: not
// to be noted) (k.mu held).
func (k *ShareKeeper) sawGrant(key string, share, now int64) {
	g, ok := k.seen[key]
	if !ok && len(k.seen) >= k.cfg.MaxKeys {
		k.sweep(now)
	}
	if !ok {
		g.share = -1
	}
	if share >= 0 {
		g.share = share
	}
	g.at = now
	k.seen[key] = g
}

// sweep drops the keys granted longer than Quiet ago; if the table is
// still full, it forgets them all (k.mu held).
func (k *ShareKeeper) sweep(now int64) {
	for key, g := range k.seen {
		if now-g.at >= int64(k.cfg.Quiet) {
			delete(k.seen, key)
		}
	}
	if len(k.seen) >= k.cfg.MaxKeys {
		clear(k.seen)
	}
}

// Return passes returns through to the store.
func (k *ShareKeeper) Return(ctx context.Context, reqs []lease.ReturnRequest) error {
	if _, err := k.settle(ctx, len(reqs), func(i int) string { return reqs[i].Key }, false); err != nil {
		return err
	}
	return k.cfg.Store.Return(ctx, reqs)
}

// Ping pings the store.
func (k *ShareKeeper) Ping(ctx context.Context) error { return k.cfg.Store.Ping(ctx) }

// SetShares writes the exchange's share updates ups through write, with the
// kept raises that became due, and fills out with each update's result. An
// update is kept instead, for its key's next grant to carry, when the store's
// share of its key is known (written by the keeper within MaxKeep) and at
// most the update's, and the key is a token bucket: its result is zero
// (nothing released: the store's bucket is no larger than the update's). So
// is an update that sets the initial share,
// with no tokens, of a key a grant found at it (sameInitial), which is
// dropped. After an error the store's share of every key sent is unknown.
func (k *ShareKeeper) SetShares(ctx context.Context, write ShareWrite, ups []lease.ShareUpdate, out []lease.ShareResult) error {
	if err := k.lockSettled(ctx, ups); err != nil {
		return err
	}
	now := k.cfg.Clock().UnixNano()
	send := make([]lease.ShareUpdate, 0, len(ups))
	idx := make([]int, 0, len(ups))
	for i, u := range ups {
		out[i] = lease.ShareResult{}
		why := k.cause(u, now)
		k.counts.add(why)
		delete(k.deferred, u.Key)
		switch why {
		case shareKept:
			k.pending[u.Key] = k.pending[u.Key].then(u, now)
			continue
		case shareSame, shareDeferred:
			delete(k.pending, u.Key)
			delete(k.due, u.Key)
			if why == shareDeferred {
				k.deferred[u.Key] = u
			}
			continue
		}
		k.carrySteps(&u, now)
		delete(k.pending, u.Key)
		delete(k.due, u.Key)
		send = append(send, u)
		idx = append(idx, i)
	}
	send, idx = k.takeDue(send, idx, now)
	k.mu.Unlock()
	return k.send(ctx, write, send, idx, out, now)
}

// cause says why u is written, or that it is kept (k.mu held).
func (k *ShareKeeper) cause(u lease.ShareUpdate, now int64) shareCause {
	w, known := k.written[u.Key]
	unknown := !known || now-w.at >= int64(k.cfg.MaxKeep)
	switch {
	case unknown && k.sameInitial(u):
		return shareSame
	case unknown && k.deferrable(u):
		return shareDeferred
	case unknown:
		return shareUnknown
	case u.SharePPM < w.ppm || u.SharePPM < k.pending[u.Key].u.SharePPM:
		// Below the store's share, or a kept raise's: written at once
		// (after the kept raise's steps), so that the tokens it releases
		// go with the share given away, as when the raise was written.
		return shareLowered
	case !k.keep || u.Limit.Fixed():
		return shareShort
	}
	return shareKept
}

// sameInitial reports whether u sets the initial share, with no tokens, on
// a token bucket a grant lately found at that share (k.mu held).
func (k *ShareKeeper) sameInitial(u lease.ShareUpdate) bool {
	if u.SharePPM != u.Limit.InitialShare || u.Received != 0 || u.Limit.Fixed() {
		return false
	}
	g, ok := k.seen[u.Key]
	return ok && g.share == u.SharePPM
}

// unsee drops what grants told of key's share: a write of it begins, or it
// was deleted (k.mu held).
func (k *ShareKeeper) unsee(key string) {
	if g, ok := k.seen[key]; ok && g.share >= 0 {
		g.share = -1
		k.seen[key] = g
	}
}

// Flush writes, through write, the kept raises that became due (of keys a
// grant found short, or all of them once raises are no longer kept). The
// exchange calls it before each epoch, so that a key that ran short has its
// raise within a sync period even when nothing else is written.
func (k *ShareKeeper) Flush(ctx context.Context, write ShareWrite) error {
	now := k.cfg.Clock().UnixNano()
	k.mu.Lock()
	send, idx := k.takeDue(nil, nil, now)
	k.mu.Unlock()
	err := k.send(ctx, write, send, idx, nil, now)
	return errors.Join(err, k.flushDeferred(ctx))
}

// takeDue appends the due kept raises to send, with index -1 (k.mu held).
// At most FlushBatch are taken; the rest stay due for the next call.
func (k *ShareKeeper) takeDue(send []lease.ShareUpdate, idx []int, now int64) ([]lease.ShareUpdate, []int) {
	n := 0
	for key := range k.due {
		if n == k.cfg.FlushBatch {
			break
		}
		delete(k.due, key)
		if p, ok := k.pending[key]; ok {
			u := p.u
			k.carrySteps(&u, now)
			send = append(send, u)
			idx = append(idx, -1)
			delete(k.pending, key)
			k.counts.Flushed++
			n++
		}
	}
	return send, idx
}

// send writes send through write and notes what the store holds; the result
// of send[j] goes to out[idx[j]] where idx[j] ≥ 0.
func (k *ShareKeeper) send(ctx context.Context, write ShareWrite, send []lease.ShareUpdate, idx []int, out []lease.ShareResult, now int64) error {
	if len(send) == 0 {
		return nil
	}
	k.mu.Lock()
	k.wseq++
	k.writing++
	for _, u := range send {
		k.unsee(u.Key)
	}
	k.mu.Unlock()
	res := make([]lease.ShareResult, len(send))
	err := write(ctx, send, res)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.wseq++
	k.writing--
	for j, u := range send {
		if err != nil {
			k.doubt[u.Key] = max(k.doubt[u.Key], u.SharePPM)
			delete(k.written, u.Key)
			if _, newer := k.pending[u.Key]; !newer && idx[j] < 0 {
				k.pending[u.Key] = kept{}.then(u, now) // a kept raise: try again when due
			}
			continue
		}
		k.written[u.Key] = wrote{ppm: u.SharePPM, at: now}
		delete(k.doubt, u.Key)
		if i := idx[j]; i >= 0 {
			out[i] = res[j]
		}
	}
	return err
}

// KeepRaises says whether raises may be kept: false while agents may lease
// through another replica of the region, whose grants the keeper does not
// see. Turning it off makes every kept raise due.
func (k *ShareKeeper) KeepRaises(keep bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case !keep:
		for key := range k.pending {
			k.due[key] = struct{}{}
		}
	case !k.keep:
		clear(k.seen) // another replica's grants were not seen
	}
	k.keep = keep
}

// Reset forgets what the keeper knows of the shares in its store, of the
// grants seen and the raises it kept: call it when another replica may have
// written shares or granted (this one takes the exchange over).
func (k *ShareKeeper) Reset() {
	k.mu.Lock()
	defer k.mu.Unlock()
	clear(k.written)
	clear(k.pending)
	clear(k.due)
	clear(k.seen)
	k.wseq++
	// The deferred updates stay: what the store holds of their keys is as
	// unknown as before, and they are written before any grant of them.
}

// SawIncarnation notes the store's incarnation (lease's Incarnation): when
// it is not the one last noted, the store may have lost writes, and the
// keeper forgets the shares it knew (Reset).
func (k *ShareKeeper) SawIncarnation(inc string) {
	k.mu.Lock()
	changed := inc != k.inc
	k.inc = inc
	k.mu.Unlock()
	if changed {
		k.Reset()
	}
}

// Forget drops what the keeper knows of keys whose shares were deleted.
func (k *ShareKeeper) Forget(keys ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.wseq++
	for _, key := range keys {
		delete(k.written, key)
		delete(k.pending, key)
		delete(k.due, key)
		delete(k.deferred, key)
		delete(k.doubt, key)
		k.unsee(key)
	}
}

// shareCause is why a share update was written, or that it was kept.
type shareCause int

const (
	shareUnknown  shareCause = iota // the store's share of the key is not known
	shareLowered                    // below the store's share
	shareShort                      // a fixed window, or raises not kept
	shareKept                       // kept, not written
	shareSame                       // the initial share a grant found in force: not written
	shareDeferred                   // not known, and written before the key's next grant or return
)

// ShareCounts counts the share updates the keeper handled by what became of
// them: written (one store operation each) because the store's share of the
// key was not known, because they lowered it (or a kept raise), because
// raises may not be kept or the key is a fixed window (Short), or later once
// raises may no longer be kept (Flushed); or kept for a grant to carry; or
// dropped as the initial share already in force (Same).
type ShareCounts struct {
	Unknown, Lowered, Short, Flushed, Kept int64
	// Same counts the updates not written because they set the initial
	// share that a grant found in force.
	Same int64
	// Deferred counts the updates deferred until their key's next grant or
	// return (deferred.go); Settled those of them written then (store
	// operations), Capped those without tokens the grant itself applied as
	// a cap on the share (none).
	Deferred, Settled, Capped int64
	// Carried counts the raises grants carried (carry.go): kept raises, and
	// deferred updates with tokens (none).
	Carried int64
}

func (c *ShareCounts) add(why shareCause) {
	switch why {
	case shareUnknown:
		c.Unknown++
	case shareLowered:
		c.Lowered++
	case shareShort:
		c.Short++
	case shareKept:
		c.Kept++
	case shareSame:
		c.Same++
	case shareDeferred:
		c.Deferred++
	}
}

// Written is the store operations of the counted updates.
func (c ShareCounts) Written() int64 { return c.Unknown + c.Lowered + c.Short + c.Flushed + c.Settled }

// Counts returns the share updates counted so far.
func (k *ShareKeeper) Counts() ShareCounts {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.counts
}
