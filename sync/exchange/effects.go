package exchange

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
)

// effects carries out the region.Node's effects on the region's store, its
// Coordinator and NATS. Every write of the holder is bounded by the time its
// hold is safe (holdCtx).
type effects struct{ x *Exchanger }

// WriteShares writes share changes in batches and returns those confirmed,
// in their order. It starts no batch after the phase's budget (writeBy)
// but the first, and none after a batch failed: a region given more writes
// than its store takes in a period writes what fits, and the Node writes
// the rest at the next epochs (an unwritten Lower gives nothing and leaves
// the key's share unknown; an unwritten raise is resynced). Without the
// bound an epoch of 100,000 writes outlasted the hold, which lapsed, and
// the take-over that followed wrote every share again (issue 12). The
// batches start at a random one, so that a backlog is written evenly.
func (fx effects) WriteShares(ctx context.Context, cs []region.ShareChange) []region.ShareChange {
	x := fx.x
	defer since(&x.spent.writes, time.Now())
	nb := (len(cs) + x.cfg.WriteBatch - 1) / x.cfg.WriteBatch
	first := 0
	if nb > 1 {
		first = rand.IntN(nb)
	}
	if x.writeBy.IsZero() { // the holder's Lower writes
		x.writeBy = x.epochAt.Add(x.cfg.Period / 2)
		if least := time.Now().Add(x.cfg.Period / 4); x.writeBy.Before(least) {
			x.writeBy = least
		}
	}
	done := make([]bool, len(cs))
	released := make([]lease.ShareResult, len(cs))
	confirmed := 0
	for b := 0; b < nb; b++ {
		if b > 0 && !time.Now().Before(x.writeBy) {
			x.deferWrites(len(cs), confirmed, "budget")
			break
		}
		if err := x.keepHold(ctx); err != nil {
			x.deferWrites(len(cs), confirmed, "hold")
			break
		}
		lo := ((first + b) % nb) * x.cfg.WriteBatch
		batch := cs[lo:min(lo+x.cfg.WriteBatch, len(cs))]
		ups := make([]lease.ShareUpdate, len(batch))
		for j, c := range batch {
			ups[j] = lease.ShareUpdateFor(c, x.limit(c.Key))
		}
		res := make([]lease.ShareResult, len(batch))
		lctx, cancel := x.holdCtx(ctx, x.cfg.StoreTimeout)
		err := x.cfg.Store.SetShares(lctx, ups, res)
		cancel()
		x.met.shareWrites.WithLabelValues("set").Add(float64(len(batch)))
		if err != nil {
			x.met.storeErrors.WithLabelValues("set_shares").Inc()
			x.cfg.Logger.Warn("exchange: writing shares", "keys", len(batch), "err", err)
			x.deferWrites(len(cs), confirmed+len(batch), "failed")
			break
		}
		copy(released[lo:], res)
		for j := range batch {
			done[lo+j] = true
		}
		confirmed += len(batch)
	}
	ok := make([]region.ShareChange, 0, confirmed)
	for i, c := range cs {
		if done[i] {
			c.Released, c.ReleasedWindow = released[i].Released, released[i].Window
			x.noteWritten(c.Key, c.SharePPM, c.Released)
			ok = append(ok, c)
		}
	}
	return ok
}

// deferWrites counts the writes of a call left for a later epoch: of n,
// those past the first tried.
func (x *Exchanger) deferWrites(n, tried int, why string) {
	if n > tried {
		x.met.deferred.Add(float64(n - tried))
		x.cfg.Logger.Debug("exchange: share writes left for a later epoch", "keys", n-tried, "of", n, "why", why)
	}
}

// noteWritten counts the share moved by a confirmed write, and the tokens it
// released to go with the share.
func (x *Exchanger) noteWritten(key string, ppm, released int64) {
	if released > 0 {
		x.met.tokensReleased.Add(float64(released) / region.TokenScale)
	}
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

// DeleteShares deletes the stored shares of keys retired at rest.
func (fx effects) DeleteShares(ctx context.Context, keys []string) {
	x := fx.x
	for i := 0; i < len(keys); i += x.cfg.WriteBatch {
		batch := keys[i:min(i+x.cfg.WriteBatch, len(keys))]
		lctx, cancel := x.holdCtx(ctx, x.cfg.StoreTimeout)
		err := x.cfg.Store.DeleteShares(lctx, batch)
		cancel()
		x.met.shareWrites.WithLabelValues("delete").Add(float64(len(batch)))
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

// Incarnation reads the store's incarnation; a failed read changes nothing
// (the Node compares the next one with the last it knew).
func (fx effects) Incarnation(ctx context.Context) (string, error) {
	x := fx.x
	defer since(&x.spent.incarnation, time.Now())
	// The first effect of a holder's Decide: the epoch's work that
	// follows has a fresh hold (a lapse found stops its writes).
	_ = x.keepHold(ctx)
	lctx, cancel := x.holdCtx(ctx, x.cfg.StoreTimeout)
	defer cancel()
	inc, err := x.cfg.Store.Incarnation(lctx)
	if err != nil {
		x.met.storeErrors.WithLabelValues("incarnation").Inc()
		x.cfg.Logger.Warn("exchange: reading the store's incarnation", "err", err)
	}
	return inc, err
}

// Persist saves the state, fenced by the hold: whole, or the records of the
// keys that changed (region.Snapshot.Partial). A whole state while the
// stored one is known (savedRecords) is saved as the records that differ.
func (fx effects) Persist(ctx context.Context, snap *region.Snapshot) error {
	x := fx.x
	defer since(&x.spent.save, time.Now())
	head, recs, err := codec.EncodeSnapshotParts(snap)
	st := SavedState{Whole: !snap.Partial, Head: head, Records: recs, Deleted: snap.Removed}
	if err == nil {
		st.Keys = make([]string, len(snap.Keys))
		for i := range snap.Keys {
			st.Keys[i] = snap.Keys[i].Key
		}
		p, converted := x.saved.partial(st)
		if converted {
			st = p
		}
		// A save has until the hold lapses: one that fails is not
		// published and makes the next one whole (or, converted, larger),
		// and a partial one of a loaded region's 40,000 changed records
		// took over a period on a starved machine (issue 12).
		err = x.keepHold(ctx)
		if err == nil {
			lctx, cancel := x.holdCtx(ctx, x.cfg.HoldTTL)
			err = x.cfg.Coordinator.Save(lctx, x.cfg.Region, x.cfg.Replica, st)
			cancel()
		}
		if converted && errors.Is(err, ErrNoWholeState) && x.keepHold(ctx) == nil {
			// Stored in a layout that takes whole saves only (a release
			// before): this one is.
			x.saved.forget()
			st = SavedState{Whole: true, Head: head, Keys: make([]string, len(snap.Keys)), Records: recs}
			for i := range snap.Keys {
				st.Keys[i] = snap.Keys[i].Key
			}
			lctx, cancel := x.holdCtx(ctx, x.cfg.HoldTTL)
			err = x.cfg.Coordinator.Save(lctx, x.cfg.Region, x.cfg.Replica, st)
			cancel()
		}
		if err != nil {
			x.saved.failed(st)
		} else {
			x.saved.saved(st)
		}
	}
	// The raises that follow, and those of gifts received, have until the
	// next epoch.
	x.writeBy = x.epochAt.Add(x.cfg.Period)
	if err != nil {
		x.met.storeErrors.WithLabelValues("save").Inc()
		x.cfg.Logger.Warn("exchange: persisting the region's state; not publishing", "whole", st.Whole, "records", len(st.Keys), "err", err)
		return err
	}
	n := len(st.Head)
	for _, r := range st.Records {
		n += len(r)
	}
	x.met.stateWritten.Add(float64(n))
	if st.Whole {
		x.met.stateBytes.Set(float64(n))
	}
	return nil
}

// Load reads the persisted state; one that does not decode is malformed.
func (fx effects) Load(ctx context.Context) (*region.Snapshot, error) {
	x := fx.x
	defer since(&x.spent.load, time.Now())
	// Until the hold lapses: a load that fails is tried again at the next
	// epoch, as large (issue 12).
	lctx, cancel := x.holdCtx(ctx, x.cfg.HoldTTL)
	defer cancel()
	st, err := x.cfg.Coordinator.Load(lctx, x.cfg.Region)
	if err != nil {
		x.met.storeErrors.WithLabelValues("load").Inc()
		return nil, err
	}
	x.saved.loaded(st)
	if st.Head == nil {
		return nil, nil
	}
	snap, err := codec.JoinSnapshot(st.Head, st.Keys, st.Records)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", region.ErrMalformed, err)
	}
	return &snap, nil
}

// Publish sends a report, split to the connection's max_payload.
func (fx effects) Publish(_ context.Context, rep *region.Report) {
	x := fx.x
	defer since(&x.spent.publish, time.Now())
	limit := int(x.cfg.Conn.MaxPayload())
	if limit <= 0 {
		limit = 1 << 20 // not connected yet: the server default
	}
	// The newest version every peer reads: during a rolling upgrade the old
	// regions would drop every report of a newer one.
	v := x.asm.WriteVersion(x.cfg.Clock(), x.peers, x.node.Config().StaleAfter)
	if v != x.wire {
		x.cfg.Logger.Info("exchange: writing wire version", "version", v, "was", x.wire)
		x.wire = v
	}
	x.met.wireVersion.Set(float64(v))
	msgs, err := codec.EncodeReportUpTo(rep, rand.Uint64(), limit, v)
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
	if rep.Exchange {
		x.top.ownReport(rep, x.cfg.TopKeys)
	}
}
