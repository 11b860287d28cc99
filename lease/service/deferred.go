package service

import (
	"context"

	"github.com/ration-dev/ration/lease"
)

// Deferred updates (issue 12). When a key enters an exchange generation the
// exchange writes its share in every region, since none knows what its
// store holds (a share of an earlier generation whose deletion was lost, or
// of an earlier process). In a region where the key has no demand the
// write buys nothing: a share only acts when a grant or a return touches
// the bucket. So an update of a key whose store share is not known, that
// releases nothing (at least the initial share: the store holds none, or a
// share the exchange already counted), is deferred and written just before
// the key's next grant or return through the keeper, which waits for it;
// an exchange write of the key waits for such a write under way and
// replaces a deferred one. Tokens it carries are credited then: only a
// grant can spend them. A failed write stays deferred and fails the grant.
//
// So the store may hold a share above a deferred update's (one of an
// earlier generation or process) while no grant or return touches the key:
// what the keeper guarantees is that every grant and return sees a share no
// larger than the exchange's. Nothing is deferred while another replica
// grants (KeepRaises false; Flush then writes what was deferred), nor below
// a share a failed write of the keeper may have left.
// (Per-user: most of the share writes left were such first writes, in the
// regions the key had no demand in.)

// deferrable reports whether u may wait for its key's next grant or return:
// the keeper writes for itself, no other replica grants (KeepRaises), and u
// lowers nothing below the initial share of a token bucket, nor below a
// share a failed write of the keeper may have left in the store (k.mu
// held).
func (k *ShareKeeper) deferrable(u lease.ShareUpdate) bool {
	if d, ok := k.doubt[u.Key]; ok && d > u.SharePPM {
		return false
	}
	return k.cfg.Write != nil && k.keep && u.SharePPM >= u.Limit.InitialShare && !u.Limit.Fixed()
}

// flushDeferred writes up to FlushBatch deferred updates while raises may
// not be kept: another replica's grants would not wait for them.
func (k *ShareKeeper) flushDeferred(ctx context.Context) error {
	k.mu.Lock()
	var send []lease.ShareUpdate
	if !k.keep {
		for key, u := range k.deferred {
			if len(send) == k.cfg.FlushBatch {
				break
			}
			delete(k.deferred, key)
			k.settling[key] = make(chan struct{})
			send = append(send, u)
		}
	}
	k.mu.Unlock()
	if len(send) == 0 {
		return nil
	}
	return k.settleWrite(ctx, send)
}

// settle writes the deferred updates of the n keys key(i) gives, and waits
// for those another call is writing, so that a grant or a return sees the
// exchange's share. With canCap (a grant), an update of a token bucket is
// returned in caps instead, for the grant to apply (carry, landCaps): one
// without tokens as a cap, since the store needs no write where it holds
// that share or less, as it mostly does (per-user: 97% of the deferred
// updates written at a grant set the initial share with no tokens); one
// with tokens as a raise, which credits them.
func (k *ShareKeeper) settle(ctx context.Context, n int, key func(int) string, canCap bool) (caps map[string]lease.ShareUpdate, err error) {
	k.mu.Lock()
	if len(k.deferred) == 0 && len(k.settling) == 0 {
		k.mu.Unlock()
		return nil, nil
	}
	var send []lease.ShareUpdate
	var wait []chan struct{}
	for i := range n {
		kk := key(i)
		if u, ok := k.deferred[kk]; ok {
			delete(k.deferred, kk)
			k.settling[kk] = make(chan struct{})
			if canCap && u.SharePPM > 0 {
				if caps == nil {
					caps = map[string]lease.ShareUpdate{}
				}
				caps[kk] = u
				continue
			}
			send = append(send, u)
		} else if ch, ok := k.settling[kk]; ok {
			wait = append(wait, ch)
		}
	}
	k.mu.Unlock()
	if len(send) > 0 {
		err = k.settleWrite(ctx, send)
	}
	for _, ch := range wait {
		if err != nil {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err != nil && caps != nil {
		k.landCaps(caps, nil, nil, err)
		caps = nil
	}
	return caps, err
}

// landCaps notes what the capped grants (reqs, answered in out, or err) did
// of the updates in caps: the store holds the update's share, or a smaller
// one (the update is then kept as a raise, k.pending); an update whose
// grant failed is deferred again unless the exchange updated its key since.
// The item of a key that carries its update (carry) is the one with MaxShare
// or Raise set: settle caps only updates of a share above 0, so one is.
func (k *ShareKeeper) landCaps(caps map[string]lease.ShareUpdate, reqs []lease.GrantRequest, out []lease.Grant, err error) {
	if len(caps) == 0 {
		return
	}
	now := k.cfg.Clock().UnixNano()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		for key, u := range caps {
			k.landCap(key, u, lease.Grant{Err: err}, now)
		}
		return
	}
	for i := range reqs {
		if u, ok := caps[reqs[i].Key]; ok && (reqs[i].MaxShare > 0 || reqs[i].Raise != nil) {
			k.landCap(reqs[i].Key, u, out[i], now)
		}
	}
}

// landCap is landCaps for one key's update u, whose grant answered g (k.mu
// held).
func (k *ShareKeeper) landCap(key string, u lease.ShareUpdate, g lease.Grant, now int64) {
	close(k.settling[key])
	delete(k.settling, key)
	if _, newer := k.deferred[key]; newer {
		return
	}
	if g.Err != nil {
		k.deferred[key] = u
		return
	}
	if u.Received == 0 {
		k.counts.Capped++
	} else {
		k.counts.Carried++
	}
	k.written[key] = wrote{ppm: g.SharePPM, at: now}
	delete(k.doubt, key)
	if g.SharePPM < u.SharePPM {
		k.pending[key] = kept{}.then(u, now) // the store holds less: a kept raise
	}
}

// settleWrite writes send, deferred updates taken out of k.deferred, and
// puts back those that failed unless the exchange updated their key since.
func (k *ShareKeeper) settleWrite(ctx context.Context, send []lease.ShareUpdate) error {
	idx := make([]int, len(send))
	for i := range idx {
		idx[i] = i
	}
	err := k.send(ctx, k.cfg.Write, send, idx, make([]lease.ShareResult, len(send)), k.cfg.Clock().UnixNano())
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, u := range send {
		close(k.settling[u.Key])
		delete(k.settling, u.Key)
		if err != nil {
			if _, newer := k.deferred[u.Key]; !newer {
				k.deferred[u.Key] = u
			}
			continue
		}
		k.counts.Settled++
	}
	return err
}

// lockSettled locks k.mu once no deferred update or kept raise of a key in
// ups is being written or carried by a grant, so that the exchange's write
// of it lands after; on an error it returns without the lock.
func (k *ShareKeeper) lockSettled(ctx context.Context, ups []lease.ShareUpdate) error {
	for {
		k.mu.Lock()
		var ch chan struct{}
		if len(k.settling) > 0 || len(k.carrying) > 0 {
			for _, u := range ups {
				if c, ok := k.settling[u.Key]; ok {
					ch = c
					break
				}
				if c, ok := k.carrying[u.Key]; ok {
					ch = c
					break
				}
			}
		}
		if ch == nil {
			return nil
		}
		k.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
