package service

import (
	"context"
	"slices"

	"github.com/ration-dev/ration/lease"
)

// Grants carry what the keeper holds back of their keys: a deferred update
// as a cap on the share (lease.GrantRequest.MaxShare; one with tokens as a
// raise), and a kept raise as a raise with its age (lease.GrantRequest.
// Raise), so that the store applies it as a write made when the exchange
// made it would have been. A key's raise is carried by one grant at a time;
// other grants of the key go on at the share in force, which is no larger,
// and the exchange's next update of the key waits for the carrying grant to
// land (lockSettled).

// takeRaises takes the kept raises of the keys of reqs that caps does not
// hold, marking them carried (k.mu held).
func (k *ShareKeeper) takeRaises(reqs []lease.GrantRequest, caps map[string]lease.ShareUpdate) map[string]kept {
	if len(k.pending) == 0 {
		return nil
	}
	var raises map[string]kept
	for i := range reqs {
		key := reqs[i].Key
		p, ok := k.pending[key]
		if !ok || reqs[i].Limit.Fixed() || slices.ContainsFunc(p.steps, func(st keptStep) bool { return st.ppm <= 0 }) {
			continue
		}
		if _, ok := caps[key]; ok {
			continue
		}
		if raises == nil {
			raises = map[string]kept{}
		}
		raises[key] = p
		delete(k.pending, key)
		delete(k.due, key)
		k.carrying[key] = make(chan struct{})
	}
	return raises
}

// carry returns reqs with the caps and raises set on the first item of
// each key, copied when anything is set; a raise's age is from its making
// to now (Clock ns).
func carry(reqs []lease.GrantRequest, caps map[string]lease.ShareUpdate, raises map[string]kept, now int64) []lease.GrantRequest {
	if len(caps) == 0 && len(raises) == 0 {
		return reqs
	}
	reqs = slices.Clone(reqs)
	done := make(map[string]bool, len(caps)+len(raises))
	for i := range reqs {
		key := reqs[i].Key
		if done[key] {
			continue
		}
		if u, ok := caps[key]; ok {
			done[key] = true
			if u.Received == 0 {
				reqs[i].MaxShare = u.SharePPM
			} else {
				reqs[i].Raise = &lease.ShareRaise{Steps: []lease.ShareStep{{SharePPM: u.SharePPM}}, Gen: u.Gen, Received: u.Received}
			}
		} else if p, ok := raises[key]; ok {
			done[key] = true
			reqs[i].Raise = &lease.ShareRaise{Steps: p.stepsAt(now), Gen: p.u.Gen, Received: p.u.Received}
		}
	}
	return reqs
}

// landRaises notes what the grants (reqs, answered in out, or err) did of
// the raises they carried: the store holds the raise's share, or, when the
// grant failed, may hold it or the share before it (the key's share is then
// in doubt, as after a failed write, and the raise kept again unless the
// exchange updated the key since).
func (k *ShareKeeper) landRaises(raises map[string]kept, reqs []lease.GrantRequest, out []lease.Grant, err error) {
	if len(raises) == 0 {
		return
	}
	now := k.cfg.Clock().UnixNano()
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := range reqs {
		key := reqs[i].Key
		p, ok := raises[key]
		if !ok || reqs[i].Raise == nil {
			continue
		}
		close(k.carrying[key])
		delete(k.carrying, key)
		if err == nil && out[i].Err == nil {
			k.counts.Carried++
			k.written[key] = wrote{ppm: out[i].SharePPM, at: now}
			delete(k.doubt, key)
			continue
		}
		k.doubt[key] = max(k.doubt[key], p.u.SharePPM)
		delete(k.written, key)
		_, newer := k.pending[key]
		_, deferred := k.deferred[key]
		if !newer && !deferred {
			k.pending[key] = p
		}
	}
}

// Retiring drops what the keeper holds back of keys whose shares the
// exchange is about to delete (kept raises, deferred updates), and waits
// for the grants and writes carrying any of it to land, so that none lands
// after the deletion and leaves a share behind it. Call Forget after the
// deletion.
func (k *ShareKeeper) Retiring(ctx context.Context, keys []string) error {
	k.mu.Lock()
	var wait []chan struct{}
	for _, key := range keys {
		delete(k.pending, key)
		delete(k.due, key)
		delete(k.deferred, key)
		if ch, ok := k.carrying[key]; ok {
			wait = append(wait, ch)
		}
		if ch, ok := k.settling[key]; ok {
			wait = append(wait, ch)
		}
	}
	k.mu.Unlock()
	for _, ch := range wait {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// KeptShare returns the share of key's kept raise, the share its bucket
// applies from when the raise was made once a grant carries it, and whether
// there is one.
func (k *ShareKeeper) KeptShare(key string) (int64, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.pending[key]
	return p.u.SharePPM, ok
}
