package exchange

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
)

// tallyPhase starts an epoch: lease, then the tallies closed and published
// at once. It reports whether this replica runs the exchange this epoch, and
// then decidePhase follows after Config.DecideAfter.
func (x *Exchanger) tallyPhase(ctx context.Context) bool {
	start := time.Now()
	now := x.cfg.Clock()
	x.pol = x.cfg.Policy()
	if n := x.asm.Expire(now); n > 0 {
		x.met.dropped.WithLabelValues(string(codec.ReasonIncomplete)).Add(float64(n))
	}
	holder, taken := x.acquire(ctx)
	if taken && x.restored {
		// Our lease had lapsed: another replica may have run the
		// exchange since, and only the persisted state knows.
		x.stepDown("lease lapsed")
	}
	switch {
	case holder && !x.restored:
		x.restored = x.takeOver(ctx)
	case !holder && x.restored:
		x.stepDown("lease lost")
	}
	x.drainTallies()
	rep := x.st.Tally(now)
	x.publish(&rep)
	x.leader.Store(x.restored)
	if x.restored {
		x.met.leader.Set(1)
	} else {
		x.met.leader.Set(0)
	}
	x.busy = time.Since(start)
	if !x.restored {
		x.endEpoch(now, "follower")
	}
	return x.restored
}

// decidePhase ends a holder's epoch: its moves, decided on the tallies
// every region published at the start of the epoch.
func (x *Exchanger) decidePhase(ctx context.Context) {
	start := time.Now()
	now := x.cfg.Clock()
	if x.restored {
		x.holderEpoch(ctx, now)
	}
	x.busy += time.Since(start)
	x.endEpoch(now, "holder")
}

// endEpoch updates the metrics of an epoch.
func (x *Exchanger) endEpoch(now time.Time, role string) {
	x.met.epochs.WithLabelValues(role).Inc()
	x.met.epochSeconds.Observe(x.busy.Seconds())
	for r, at := range x.heard {
		x.met.reportAge.WithLabelValues(r).Set(now.Sub(at).Seconds())
	}
	x.updateTopKeys()
	x.epochs.Add(1)
}

// applyReceived writes the shares raised by the gifts just received
// (region.State.Apply): a gift is in use a network delay after it is given.
func (x *Exchanger) applyReceived(ctx context.Context) {
	cs := x.st.Apply()
	if len(cs) == 0 {
		return
	}
	ok := x.writeShares(ctx, cs)
	if len(ok) == len(cs) {
		return
	}
	done := make(map[string]bool, len(ok))
	for _, c := range ok {
		done[c.Key] = true
	}
	for _, c := range cs {
		if !done[c.Key] {
			x.st.Resync(c.Key)
		}
	}
}

// acquire takes or renews the exchange lease and reports whether this
// replica holds it, and whether it was taken afresh. The lease counts from
// before the call, less a margin, so that this replica stops writing before
// the store lets another replica take over (the store times it from
// later; monotonic clocks run at nearly the same rate).
func (x *Exchanger) acquire(ctx context.Context) (holder, taken bool) {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, x.cfg.StoreTimeout)
	defer cancel()
	hold, err := x.cfg.Coordinator.AcquireExchange(ctx, x.cfg.Region, x.cfg.Replica, x.cfg.LeaseTTL)
	if err != nil {
		x.met.storeErrors.WithLabelValues("lease").Inc()
		x.cfg.Logger.Warn("exchange: lease", "err", err)
		// Keep writing only while the lease we had is still safe.
		return x.restored && time.Now().Before(x.leaseUntil), false
	}
	if hold != lease.HoldNone {
		x.leaseUntil = sent.Add(x.cfg.LeaseTTL - x.cfg.LeaseTTL/10)
	} else {
		x.prev = nil // another replica holds the lease: its state counts
	}
	return hold != lease.HoldNone, hold == lease.HoldTaken
}

// leaseCtx bounds a holder's store write by the store timeout and by the
// time its lease is safe: a write that would land after another replica
// may have taken over is never sent.
func (x *Exchanger) leaseCtx(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	d := time.Now().Add(timeout)
	if x.leaseUntil.Before(d) {
		d = x.leaseUntil
	}
	return context.WithDeadline(ctx, d)
}

// takeOver restores the region's persisted state: the replica that held
// the lease before may have given share away, and only the persisted state
// says how much. It reports whether this replica may run the exchange.
func (x *Exchanger) takeOver(ctx context.Context) bool {
	lctx, cancel := x.leaseCtx(ctx, x.cfg.Period)
	defer cancel()
	blob, err := x.cfg.Coordinator.LoadExchangeState(lctx, x.cfg.Region)
	if err != nil {
		x.met.storeErrors.WithLabelValues("load").Inc()
		x.cfg.Logger.Warn("exchange: loading the region's state; retrying next epoch", "err", err)
		return false
	}
	if x.keepPrev(blob) {
		x.st, x.prev = x.prev, nil
		x.st.ResyncAll() // the shares we wrote went with the rest
		x.cfg.Logger.Warn("exchange: the store holds no newer exchange state than the one this replica dropped (it lost writes); keeping ours",
			"keys", x.st.Keys())
		clear(x.written)
		return true
	}
	x.prev = nil
	if blob != nil {
		snap, err := codec.DecodeSnapshot(blob)
		if err == nil {
			err = x.st.Restore(snap)
		}
		if err != nil {
			// Starting afresh could give twice what the lost state gave:
			// stay a follower until an operator repairs the store.
			x.met.storeErrors.WithLabelValues("restore").Inc()
			x.cfg.Logger.Error("exchange: the region's persisted state is unusable; not exchanging", "err", err)
			return false
		}
	}
	clear(x.written) // unknown until written again
	x.cfg.Logger.Info("exchange: running the region's exchange", "replica", x.cfg.Replica, "keys", x.st.Keys())
	return true
}

// stepDown drops the exchange state: the persisted one counts, and the
// next take-over restores it. The state dropped is kept aside (prev) until
// another replica is seen holding the lease: if the store then holds
// nothing newer, it lost writes (a restart, a failover), and prev is the
// region's state (see keepPrev).
func (x *Exchanger) stepDown(why string) {
	st, err := region.New(x.rcfg)
	if err != nil {
		panic(err) // the same config made x.st
	}
	if x.restored {
		x.prev = x.st
	}
	x.st, x.restored = st, false
	clear(x.written)
	x.cfg.Logger.Info("exchange: no longer running the region's exchange", "replica", x.cfg.Replica, "why", why)
}

// keepPrev reports whether to take over with the state this replica last
// dropped rather than with blob, the persisted one: when the store holds
// none, or an older one. Only a holder persists, before it publishes, so
// a state newer than ours in the store is another replica's, and we would
// have seen that replica hold the lease (which forgets prev). A store that
// holds none or an older one lost writes, and restoring that (or starting
// afresh) would give again what we already gave: peers reject reports whose
// counters went down, and the shares would sum above PPM for as long as it
// lasts. A blob that does not decode is left to takeOver's error path.
func (x *Exchanger) keepPrev(blob []byte) bool {
	if x.prev == nil {
		return false
	}
	if blob == nil {
		return true
	}
	snap, err := codec.DecodeSnapshot(blob)
	return err == nil && snap.Epoch < x.prev.LastEpoch()
}

// holderEpoch runs the epoch protocol of region.State.Epoch: lower, commit,
// persist, publish, raise, retire.
func (x *Exchanger) holderEpoch(ctx context.Context, now time.Time) {
	x.checkIncarnation(ctx)
	plan := x.st.Epoch(now)
	plan.Lower = x.writeShares(ctx, plan.Lower)
	if err := x.st.Commit(plan); err != nil {
		x.cfg.Logger.Error("exchange: commit", "err", err) // a bug: plans are committed once
		return
	}
	snap := x.st.Snapshot()
	blob, err := codec.EncodeSnapshot(&snap)
	if err == nil {
		lctx, cancel := x.leaseCtx(ctx, x.cfg.Period)
		err = x.cfg.Coordinator.SaveExchangeState(lctx, x.cfg.Region, x.cfg.Replica, blob)
		cancel()
	}
	if err != nil {
		// Publishing now could announce gifts a successor never learns of.
		x.met.storeErrors.WithLabelValues("save").Inc()
		x.cfg.Logger.Warn("exchange: persisting the region's state; not publishing", "err", err)
		if errors.Is(err, lease.ErrNotHolder) {
			x.stepDown("another replica holds the lease")
		}
		return
	}
	x.met.stateBytes.Set(float64(len(blob)))
	rep := x.st.Report()
	x.publish(&rep)
	x.top.ownReport(&rep, x.cfg.TopKeys)
	for _, c := range plan.Raise {
		if !x.wrote(ctx, c) {
			x.st.Resync(c.Key)
		}
	}
	x.retire(ctx, plan.Retire)
}

// checkIncarnation reads the store's incarnation. When it changed since
// the last epoch the store may have lost writes, among them shares lowered
// by gifts, which would stay raised: this epoch writes every share again,
// before anything is given (region.State.ResyncAll). A failed read changes
// nothing; the next one compares with the last incarnation known.
func (x *Exchanger) checkIncarnation(ctx context.Context) {
	lctx, cancel := x.leaseCtx(ctx, x.cfg.StoreTimeout)
	inc, err := x.cfg.Store.Incarnation(lctx)
	cancel()
	if err != nil {
		x.met.storeErrors.WithLabelValues("incarnation").Inc()
		x.cfg.Logger.Warn("exchange: reading the store's incarnation", "err", err)
		return
	}
	if x.st.SawStore(inc) {
		x.met.resyncs.Inc()
		x.cfg.Logger.Warn("exchange: the store is a new incarnation and may have lost writes; writing every share again",
			"now", inc, "keys", x.st.Keys())
	}
}

// writeShares writes share changes in batches and returns those confirmed.
func (x *Exchanger) writeShares(ctx context.Context, cs []region.ShareChange) []region.ShareChange {
	ok := cs[:0:0]
	for i := 0; i < len(cs); i += x.cfg.WriteBatch {
		batch := cs[i:min(i+x.cfg.WriteBatch, len(cs))]
		ups := make([]lease.ShareUpdate, len(batch))
		for j, c := range batch {
			ups[j] = lease.ShareUpdate{Key: c.Key, SharePPM: c.SharePPM, Limit: x.limit(c.Key)}
		}
		lctx, cancel := x.leaseCtx(ctx, x.cfg.StoreTimeout)
		err := x.cfg.Store.SetShares(lctx, ups)
		cancel()
		if err != nil {
			x.met.storeErrors.WithLabelValues("set_shares").Inc()
			x.cfg.Logger.Warn("exchange: writing shares", "keys", len(batch), "err", err)
			continue
		}
		for _, c := range batch {
			x.noteWritten(c.Key, c.SharePPM)
		}
		ok = append(ok, batch...)
	}
	return ok
}

// wrote writes one change (a Raise) and reports success.
func (x *Exchanger) wrote(ctx context.Context, c region.ShareChange) bool {
	return len(x.writeShares(ctx, []region.ShareChange{c})) == 1
}

// noteWritten counts the share moved by a confirmed write.
func (x *Exchanger) noteWritten(key string, ppm int64) {
	old, ok := x.written[key]
	if !ok {
		old = x.initial
	}
	switch {
	case ppm < old:
		x.met.moved.WithLabelValues("given").Add(float64(old - ppm))
	case ppm > old:
		x.met.moved.WithLabelValues("received").Add(float64(ppm - old))
	}
	x.written[key] = ppm
}

// retire deletes the stored shares of keys retired at rest.
func (x *Exchanger) retire(ctx context.Context, keys []string) {
	for i := 0; i < len(keys); i += x.cfg.WriteBatch {
		batch := keys[i:min(i+x.cfg.WriteBatch, len(keys))]
		lctx, cancel := x.leaseCtx(ctx, x.cfg.StoreTimeout)
		err := x.cfg.Store.DeleteShares(lctx, batch)
		cancel()
		if err != nil {
			// The store keeps the share we held, which is ours: safe, and
			// the key's next generation rewrites it before any gift.
			x.met.storeErrors.WithLabelValues("delete_shares").Inc()
			x.cfg.Logger.Warn("exchange: deleting retired shares", "keys", len(batch), "err", err)
			continue
		}
		for _, k := range batch {
			delete(x.written, k)
		}
	}
}

// limit is the allocator's limit of a key, as lease/service computes it.
// A key whose rule left the policy gets a limit of one token: writing its
// share then only clips its bucket, which nobody can lease from anyway.
func (x *Exchanger) limit(key string) lease.Limit {
	r := x.rule(key)
	if r == nil {
		return lease.Limit{Rate: 1, Burst: 1, Cost: 1, InitialShare: x.initial}
	}
	return lease.Limit{Rate: r.Rate(), Burst: float64(r.Burst), Cost: r.Cost, InitialShare: x.initial, StartEmpty: r.StartEmpty}
}

// publish sends a report, split to the connection's max_payload.
func (x *Exchanger) publish(rep *region.Report) {
	limit := int(x.cfg.Conn.MaxPayload())
	if limit <= 0 {
		limit = 1 << 20 // not connected yet: the server default
	}
	msgs, err := codec.EncodeReport(rep, rand.Uint64(), limit)
	if err != nil {
		x.met.publishErrors.Inc()
		x.cfg.Logger.Error("exchange: encoding the report", "err", err)
		return
	}
	for _, m := range msgs {
		if err := x.cfg.Conn.Publish(x.subject, m); err != nil {
			x.met.publishErrors.Inc()
			x.cfg.Logger.Warn("exchange: publishing", "subject", x.subject, "err", err)
			return
		}
		x.met.published.Inc()
		x.met.publishedBytes.Add(float64(len(m)))
	}
}
