package exchange

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
)

// effects carries out the region.Node's effects on the region's store, its
// Coordinator and NATS. Every write of the holder is bounded by the time its
// hold is safe (holdCtx).
type effects struct{ x *Exchanger }

// WriteShares writes share changes in batches and returns those confirmed.
func (fx effects) WriteShares(ctx context.Context, cs []region.ShareChange) []region.ShareChange {
	x := fx.x
	ok := cs[:0:0]
	for i := 0; i < len(cs); i += x.cfg.WriteBatch {
		batch := cs[i:min(i+x.cfg.WriteBatch, len(cs))]
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
			continue
		}
		for j, c := range batch {
			c.Released, c.ReleasedWindow = res[j].Released, res[j].Window
			x.noteWritten(c.Key, c.SharePPM, c.Released)
			ok = append(ok, c)
		}
	}
	return ok
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
// keys that changed (region.Snapshot.Partial).
func (fx effects) Persist(ctx context.Context, snap *region.Snapshot) error {
	x := fx.x
	head, recs, err := codec.EncodeSnapshotParts(snap)
	st := SavedState{Whole: !snap.Partial, Head: head, Records: recs, Deleted: snap.Removed}
	if err == nil {
		st.Keys = make([]string, len(snap.Keys))
		for i := range snap.Keys {
			st.Keys[i] = snap.Keys[i].Key
		}
		// A whole state (after a take-over) may be many megabytes: it has
		// until the hold lapses, the partial ones that follow a period.
		timeout := x.cfg.Period
		if st.Whole {
			timeout = x.cfg.HoldTTL
		}
		lctx, cancel := x.holdCtx(ctx, timeout)
		err = x.cfg.Coordinator.Save(lctx, x.cfg.Region, x.cfg.Replica, st)
		cancel()
	}
	if err != nil {
		x.met.storeErrors.WithLabelValues("save").Inc()
		x.cfg.Logger.Warn("exchange: persisting the region's state; not publishing", "err", err)
		return err
	}
	n := len(head)
	for _, r := range recs {
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
	lctx, cancel := x.holdCtx(ctx, x.cfg.Period)
	defer cancel()
	st, err := x.cfg.Coordinator.Load(lctx, x.cfg.Region)
	if err != nil {
		x.met.storeErrors.WithLabelValues("load").Inc()
		return nil, err
	}
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
