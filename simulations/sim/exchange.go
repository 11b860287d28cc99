package sim

import (
	"context"
	"errors"
	"fmt"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
)

// Each region runs the production exchange protocol (region.Node); the
// simulator is its Effects, as sync/exchange is in regiond: the region's
// memory store, the state it persists, and the modelled NATS. Effects act
// at the simulated time of the event being handled.

// regionFx carries out region r's exchange effects.
type regionFx struct {
	w *world
	r *regiond
}

// newNode starts region r's exchange: a new regiond process, which holds its
// region's election (one replica a region) and takes over from the state
// last persisted, if any.
func (w *world) newNode(r *regiond) error {
	n, err := region.NewNode(r.rcfg, regionFx{w, r})
	if err != nil {
		return fmt.Errorf("sim: region %s: %w", r.name, err)
	}
	if ch := n.Hold(w.ctx, region.HoldTaken); ch.Err != nil {
		return fmt.Errorf("sim: region %s: %w", r.name, ch.Err)
	}
	r.node = n
	if r.keeper != nil {
		r.keeper.Reset() // a new process knows nothing of the shares in its store
	}
	return nil
}

func (fx regionFx) WriteShares(_ context.Context, cs []region.ShareChange) []region.ShareChange {
	w, r := fx.w, fx.r
	ups := make([]lease.ShareUpdate, len(cs))
	now := w.regionTime(r)
	for i, c := range cs {
		ups[i] = lease.ShareUpdateFor(c, service.Limit(w.set.RuleOf(c.Key), r.initial, now))
	}
	res := make([]lease.ShareResult, len(cs))
	w.noteWindowRaises(r, cs)
	// Through the share keeper, as regiond's exchange writes: it keeps the
	// raises of keys whose bucket has plenty.
	if err := r.keeper.SetShares(w.ctx, fx.write(), ups, res); err != nil {
		w.fail(fmt.Errorf("sim: region %s: writing shares: %w", r.name, err))
		return nil
	}
	for i := range cs {
		cs[i].Released, cs[i].ReleasedWindow = res[i].Released, res[i].Window
		r.svc.Forget(cs[i].Key) // as regiond's exchange does
	}
	// A rewrite (after a restart or a failover) may put back share that a
	// reclaim took and the restored state has not heard of.
	w.noteReclaims(cs, w.now)
	return cs
}

func (fx regionFx) DeleteShares(_ context.Context, keys []string) {
	w, r := fx.w, fx.r
	if err := r.keeper.Retiring(w.ctx, keys); err != nil {
		w.fail(fmt.Errorf("sim: region %s: retiring shares: %w", r.name, err))
	}
	if err := r.store.DeleteShares(w.ctx, keys); err != nil {
		w.fail(fmt.Errorf("sim: region %s: retiring shares: %w", r.name, err))
	}
	r.svc.Forget(keys...)
	r.keeper.Forget(keys...)
	w.shareWrites += int64(len(keys))
}

// write writes shares to the region's store at its time, counting them.
func (fx regionFx) write() service.ShareWrite {
	return func(_ context.Context, ups []lease.ShareUpdate, res []lease.ShareResult) error {
		fx.w.shareWrites += int64(len(ups))
		return fx.r.store.SetSharesAt(fx.w.regionTime(fx.r), ups, res)
	}
}

// Incarnation reads the store's incarnation and tells the share keeper, as
// regiond's exchange does: a store that may have lost writes may have lost
// the shares it knows. The raises it kept for keys that ran short are
// written then, before the epoch (one replica a region here: raises are
// always kept).
func (fx regionFx) Incarnation(ctx context.Context) (string, error) {
	inc, err := fx.r.store.Incarnation(ctx)
	if err == nil {
		fx.r.keeper.SawIncarnation(inc)
		if ferr := fx.r.keeper.Flush(ctx, fx.write()); ferr != nil {
			fx.w.fail(fmt.Errorf("sim: region %s: writing kept raises: %w", fx.r.name, ferr))
		}
	}
	return inc, err
}

// Persist keeps the state a restarted regiond comes back with; a scenario
// without restarts never reads it.
func (fx regionFx) Persist(_ context.Context, snap *region.Snapshot) error {
	if fx.w.restarts {
		fx.r.persisted = region.MergeSnapshot(fx.r.persisted, snap)
	}
	return nil
}

func (fx regionFx) Load(context.Context) (*region.Snapshot, error) { return fx.r.persisted, nil }

func (fx regionFx) Publish(_ context.Context, rep *region.Report) { fx.w.publish(fx.r, rep, fx.w.now) }

// epoch starts region r's exchange epoch at t as regiond's exchanger does:
// the tallies are closed and published, and the moves are decided a quarter
// period later (exchange.Config.DecideAfter's default), when every region's
// tallies have arrived.
func (w *world) epoch(r *regiond, t int64) {
	w.ev.push(event{at: t + int64(w.sc.SyncPeriod), kind: evEpoch, region: r.idx})
	if r.down > 0 {
		return // the regiond is down: no exchange
	}
	r.node.Tally(w.ctx, w.base.Add(dur(t+r.skew)))
	w.enforce(r)
	w.ev.push(event{at: t + int64(w.sc.SyncPeriod)/4, kind: evDecide, region: r.idx})
}

// decide ends region r's epoch at t (region.Node.Decide).
func (w *world) decide(r *regiond, t int64) {
	if r.down > 0 {
		return
	}
	if d := r.node.Decide(w.ctx, w.base.Add(dur(t+r.skew))); d.Err != nil {
		w.fail(fmt.Errorf("sim: region %s: %w", r.name, d.Err))
	}
	w.enforce(r)
}

// enforce gives region r's service and agents its policy with the rules
// its exchange disagrees on made stricter, when they changed: what
// regiond does on exchange.Config.OnDisagree (agents hear it at once here,
// over the policy stream there, within milliseconds).
func (w *world) enforce(r *regiond) {
	if r.node.DisagreementGen() == r.agreeGen && r.enforced != nil {
		return
	}
	ds, gen := r.node.Disagreements()
	r.agreeGen = gen
	set, _, err := r.base.Agreed(ds)
	if err != nil {
		w.fail(fmt.Errorf("sim: region %s: %w", r.name, err))
		return
	}
	if set == r.enforced {
		return
	}
	r.enforced = set
	r.svc.SetPolicy(set)
	for _, a := range r.agents {
		a.d.SetPolicy(set)
	}
}

// maxPayload is NATS's default max_payload, to which reports are split.
const maxPayload = 1 << 20

// reportID stands for the random id the exchanger gives each report: the
// largest, whose varint takes the most bytes, so that runs stay
// deterministic and never count less than the wire carries.
const reportID = ^uint64(0)

// publish sends a report to every other region over the modelled NATS,
// counting what it costs there in the production wire format (sync/codec).
func (w *world) publish(r *regiond, rep *region.Report, t int64) {
	bytes, msgs, err := codec.Size(rep, reportID, maxPayload)
	if err != nil {
		w.fail(fmt.Errorf("sim: region %s: encoding a report: %w", r.name, err))
		return
	}
	w.natsMsgs += int64(msgs)
	w.natsBytes += int64(bytes)
	nw := &w.sc.Network
	for _, to := range w.rs {
		if to == r {
			continue
		}
		if r.partitioned > 0 || to.partitioned > 0 {
			continue
		}
		kind := uint64(0)
		if rep.Exchange {
			kind = 1
		}
		h := reportDraw(w.sc.Seed, uint64(r.idx)<<1|kind, uint64(to.idx), uint64(t))
		if nw.Loss > 0 && float64(h>>11)/(1<<53) < nw.Loss {
			continue
		}
		d := int64(nw.Delay)
		if j := int64(nw.Jitter); j > 0 {
			d += int64(mix64(h^1)%uint64(2*j+1)) - j
		}
		w.ev.push(event{at: t + max(d, 0), kind: evReport, region: to.idx, from: r.idx, report: rep})
	}
}

// deliver hands a report to its region (region.Node.Receive).
func (w *world) deliver(e *event) {
	to, from := w.rs[e.region], w.rs[e.from]
	if to.partitioned > 0 || from.partitioned > 0 || to.down > 0 {
		return // the partition began while it was on its way, or to is down
	}
	err := to.node.Receive(w.ctx, w.base.Add(dur(e.at+to.skew)), e.report)
	switch {
	case err == nil:
	case errors.Is(err, region.ErrStale):
		w.recvStale++
	default:
		w.recvErrors++
	}
}
