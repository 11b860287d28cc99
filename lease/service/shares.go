package service

import (
	"context"
	"sync"
	"time"

	"github.com/ration-dev/ration/lease"
)

// Deferred raises (issue 13). The exchange writes a key's applied share
// whenever its target moves: for a long tail of keys asked a few times a
// minute, each ask moves the key's share towards the region that asked and
// back, several share writes for one admitted request (per-user: 1.17 store
// operations per admitted request were share writes). A raise only lets the
// bucket grant more, so the store may hold a lower share than the exchange
// believes, never a higher one: a raise of a key that is not short is kept
// here rather than written, and written before the exchange's next epoch
// once a grant finds the key short (denied, or left more than a cost below
// its capacity: a key being spent from has its raises written at once); a
// lowering that does not go below what the store holds needs no write
// either. The store's share of every key stays at most the share the
// exchange counts as applied, so the bound is unchanged (DESIGN.md, "Share
// raises wait for need"); what a deferred raise costs is utilization while
// it waits, at most a sync period after the key ran short.
//
// What the store holds is known only from this service's own writes since
// ResetShares: the caller resets when another replica may have written
// (taking over the exchange) or the store may have lost writes (its
// incarnation changed). Forget, for keys whose shares were deleted, forgets
// them here too.

// ShareWrite writes share updates to the region's store, one result each:
// lease.RedisStore's and lease.MemoryStore's SetShares.
type ShareWrite func(ctx context.Context, ups []lease.ShareUpdate, out []lease.ShareResult) error

// shareBook is what the service knows of the shares in its store.
type shareBook struct {
	mu sync.Mutex
	// written is the share of each key the store holds, as this service
	// last wrote it; pending the raises not written yet, and short the
	// keys among them that a grant found short since the last write.
	written map[string]int64
	pending map[string]lease.ShareUpdate
	short   map[string]struct{}
	// shortAt is when a grant last found each key short (Clock
	// nanoseconds), kept for shortFor: a key short lately gets its raises
	// written at once, since it may need them before the next write.
	shortAt map[string]int64
	// inc is the store's incarnation last noted (SawIncarnation).
	inc string
	// writeAll is set while raises may not be kept (KeepRaises(false)).
	writeAll bool
}

func newShareBook() *shareBook {
	return &shareBook{written: map[string]int64{}, pending: map[string]lease.ShareUpdate{},
		short: map[string]struct{}{}, shortAt: map[string]int64{}}
}

// WriteShares writes the exchange's share updates ups through write, with
// the deferred raises of keys found short since the last call, and fills
// out with each update's result. An update that raises a key's share (or
// keeps it) above what this service last wrote, for a token bucket the
// service does not remember dry, is deferred: its result is zero (nothing
// released, since the bucket's capacity in the store is at most the new
// one). After an error nothing it sent counts as known.
func (s *Service) WriteShares(ctx context.Context, write ShareWrite, ups []lease.ShareUpdate, out []lease.ShareResult) error {
	bk := s.shares
	now := s.cfg.Clock().UnixNano()
	send := make([]lease.ShareUpdate, 0, len(ups))
	idx := make([]int, 0, len(ups))
	bk.mu.Lock()
	for i, u := range ups {
		out[i] = lease.ShareResult{}
		w, known := bk.written[u.Key]
		at, wasShort := bk.shortAt[u.Key]
		if wasShort && now-at >= int64(shortFor) {
			delete(bk.shortAt, u.Key)
			wasShort = false
		}
		var why shareCause
		switch {
		case !known:
			why = shareUnknown
		case u.SharePPM < w:
			why = shareLowered
		case u.Limit.Fixed() || wasShort || bk.writeAll || s.dry.holds(u.Key, now):
			why = shareShort
		default:
			bk.pending[u.Key] = u
			s.shareCounts[shareDeferred].Add(1)
			continue
		}
		s.shareCounts[why].Add(1)
		delete(bk.pending, u.Key)
		delete(bk.short, u.Key)
		send = append(send, u)
		idx = append(idx, i)
	}
	send, idx = bk.takeShort(send, idx)
	bk.mu.Unlock()
	return s.sendShares(ctx, write, send, idx, out)
}

// FlushShares writes, through write, the kept raises of the keys a grant
// found short since the last write: the exchange calls it before each
// epoch (regiond and the simulator, where they read the store's
// incarnation), so a key that runs short has its raise within a sync period
// even when the exchange writes nothing else.
func (s *Service) FlushShares(ctx context.Context, write ShareWrite) error {
	bk := s.shares
	bk.mu.Lock()
	send, idx := bk.takeShort(nil, nil)
	bk.mu.Unlock()
	return s.sendShares(ctx, write, send, idx, nil)
}

// KeepRaises says whether raises may be kept (the default) or must all be
// written: the caller turns it off while another replica of its region may
// serve agents, whose grants this service never sees, so that a key spent
// from there is not kept from its share. Off, the next FlushShares writes
// every raise kept so far.
func (s *Service) KeepRaises(on bool) {
	bk := s.shares
	bk.mu.Lock()
	defer bk.mu.Unlock()
	bk.writeAll = !on
}

// takeShort appends the kept raises of the keys found short (every kept
// raise while none may be kept) to send, with index -1 (bk.mu held).
func (bk *shareBook) takeShort(send []lease.ShareUpdate, idx []int) ([]lease.ShareUpdate, []int) {
	if bk.writeAll {
		for k, u := range bk.pending {
			send = append(send, u)
			idx = append(idx, -1)
			delete(bk.pending, k)
		}
		clear(bk.short)
		return send, idx
	}
	for k := range bk.short {
		if u, ok := bk.pending[k]; ok {
			send = append(send, u)
			idx = append(idx, -1)
			delete(bk.pending, k)
		}
	}
	clear(bk.short)
	return send, idx
}

// sendShares writes send through write and notes what the store holds; the
// result of send[j] goes to out[idx[j]] where idx[j] ≥ 0.
func (s *Service) sendShares(ctx context.Context, write ShareWrite, send []lease.ShareUpdate, idx []int, out []lease.ShareResult) error {
	bk := s.shares
	if len(send) == 0 {
		return nil
	}
	res := make([]lease.ShareResult, len(send))
	err := write(ctx, send, res)
	s.shareCounts[shareFlushed].Add(int64(len(send) - countWritten(idx)))
	bk.mu.Lock()
	for j, u := range send {
		if err != nil {
			delete(bk.written, u.Key)
			continue
		}
		bk.written[u.Key] = u.SharePPM
		if i := idx[j]; i >= 0 {
			out[i] = res[j]
		}
	}
	bk.mu.Unlock()
	// A share written may let a dry bucket grant at once (a raise, tokens
	// given with it); after a failure it may have landed.
	for _, u := range send {
		s.dry.forget(u.Key)
	}
	return err
}

func countWritten(idx []int) int {
	n := 0
	for _, i := range idx {
		if i >= 0 {
			n++
		}
	}
	return n
}

// ResetShares forgets what the service knows of the shares in its store,
// and the raises it deferred: call it when another replica may have written
// shares (this one takes the exchange over) or the store may have lost
// writes (its incarnation changed). Every write after it goes to the store.
func (s *Service) ResetShares() {
	bk := s.shares
	bk.mu.Lock()
	defer bk.mu.Unlock()
	clear(bk.written)
	clear(bk.pending)
	clear(bk.short)
}

// SawIncarnation notes the store's incarnation (lease's Incarnation): when
// it is not the one last noted, the store may have lost writes, and the
// service forgets the shares it knew (ResetShares).
func (s *Service) SawIncarnation(inc string) {
	bk := s.shares
	bk.mu.Lock()
	changed := inc != bk.inc
	bk.inc = inc
	bk.mu.Unlock()
	if changed {
		s.ResetShares()
	}
}

// forget drops what the book knows of key (its share was deleted).
func (bk *shareBook) forget(key string) {
	bk.mu.Lock()
	defer bk.mu.Unlock()
	delete(bk.written, key)
	delete(bk.pending, key)
	delete(bk.short, key)
}

// shortFor is how long a key a grant found short has its raises written at
// once: ten sync periods at the default.
const shortFor = 10 * time.Second

// ranShort notes that a grant found key short at now: its deferred raise,
// if any, goes with the exchange's next write, and its raises for shortFor
// are written at once.
func (bk *shareBook) ranShort(key string, now int64) {
	bk.mu.Lock()
	defer bk.mu.Unlock()
	if len(bk.shortAt) >= maxShortKeys {
		bk.sweepShort(now)
	}
	bk.shortAt[key] = now
	if _, ok := bk.pending[key]; ok {
		bk.short[key] = struct{}{}
	}
}

// maxShortKeys bounds the keys whose shortness is remembered: beyond it
// those short longer ago than shortFor are dropped, then all.
const maxShortKeys = 1 << 20

func (bk *shareBook) sweepShort(now int64) {
	for k, at := range bk.shortAt {
		if now-at >= int64(shortFor) {
			delete(bk.shortAt, k)
		}
	}
	if len(bk.shortAt) >= maxShortKeys {
		clear(bk.shortAt)
	}
}

// shareCause is why a share update was written, or that it was kept.
type shareCause int

const (
	shareUnknown  shareCause = iota // the store's share of the key is not known
	shareLowered                    // below the store's share
	shareShort                      // a key short lately, remembered dry, or a fixed window
	shareFlushed                    // a raise kept until the key ran short
	shareDeferred                   // kept, not written
	shareCauses
)

// ShareCounts counts the share updates of the exchange's writes
// (WriteShares, FlushShares) by what became of them: written to the store
// (one store operation each) because the store's share of the key was not
// known, because they lowered it, because the key was short, or later,
// once the key ran short (Flushed); or kept (Deferred), which costs none.
type ShareCounts struct {
	Unknown, Lowered, Short, Flushed, Deferred int64
}

// Written is the store operations of the counted updates.
func (c ShareCounts) Written() int64 { return c.Unknown + c.Lowered + c.Short + c.Flushed }

// ShareCounts returns the share updates counted so far.
func (s *Service) ShareCounts() ShareCounts {
	return ShareCounts{
		Unknown: s.shareCounts[shareUnknown].Load(), Lowered: s.shareCounts[shareLowered].Load(),
		Short: s.shareCounts[shareShort].Load(), Flushed: s.shareCounts[shareFlushed].Load(),
		Deferred: s.shareCounts[shareDeferred].Load(),
	}
}
