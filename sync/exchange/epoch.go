package exchange

import (
	"context"
	"errors"
	"time"

	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
)

// tallyPhase starts an epoch: the hold, then the tallies closed and
// published at once. It reports whether this replica runs the exchange this
// epoch, and then decidePhase follows after Config.DecideAfter.
func (x *Exchanger) tallyPhase(ctx context.Context) bool {
	start := time.Now()
	x.epochAt = start
	x.writeBy = start.Add(x.cfg.Period)
	x.spent = spent{receive: x.spent.receive} // the epoch's, and the reports merged since the last
	b := x.spent
	now := x.cfg.Clock()
	if pol := x.cfg.Policy(); pol != x.pol {
		x.pol = pol
		x.node.PolicyChanged() // keys at rest read the policy again
	}
	if n := x.asm.Expire(now); n > 0 {
		x.met.dropped.WithLabelValues(string(codec.ReasonIncomplete)).Add(float64(n))
	}
	x.noteHold(x.node.Hold(ctx, x.renew(ctx)))
	x.drainTallies()
	x.node.Tally(ctx, now)
	holding := x.node.Holding()
	x.leader.Store(holding)
	if holding {
		x.met.leader.Set(1)
	} else {
		x.met.leader.Set(0)
	}
	x.busy = time.Since(start)
	x.spent.tally = x.busy
	x.spent.node += x.busy - (x.spent.effects() - b.effects())
	if !holding {
		x.endEpoch(now, "follower")
	}
	return holding
}

// decidePhase ends a holder's epoch: its moves, decided on the tallies
// every region published at the start of the epoch.
func (x *Exchanger) decidePhase(ctx context.Context) {
	start := time.Now()
	x.writeBy = time.Time{} // set by the first write (effects.WriteShares)
	b := x.spent
	now := x.cfg.Clock()
	d := x.node.Decide(ctx, now)
	if d.Resynced {
		x.met.resyncs.Inc()
		x.cfg.Logger.Warn("exchange: the store is a new incarnation and may have lost writes; writing every share again",
			"keys", x.node.Keys())
	}
	if errors.Is(d.Err, region.ErrStalePlan) || errors.Is(d.Err, region.ErrInvalidPlan) {
		x.cfg.Logger.Error("exchange: commit", "err", d.Err) // a bug: plans are committed once
	}
	if d.SteppedDown {
		x.steppedDown("another replica holds the hold")
	}
	x.spent.decide = time.Since(start)
	x.spent.node += x.spent.decide - (x.spent.effects() - b.effects())
	x.busy += x.spent.decide
	x.endEpoch(now, "holder")
}

// endEpoch updates the metrics of an epoch.
func (x *Exchanger) endEpoch(now time.Time, role string) {
	x.met.epochs.WithLabelValues(role).Inc()
	x.met.epochSeconds.Observe(x.busy.Seconds())
	for r, at := range x.heard {
		x.met.reportAge.WithLabelValues(r).Set(now.Sub(at).Seconds())
	}
	if role != "follower" {
		resting, held := x.node.Resting()
		x.met.keys.WithLabelValues("held").Set(float64(held))
		x.met.keys.WithLabelValues("resting").Set(float64(resting))
		if a := x.node.Awake(); a.Epoch != x.awakeEpoch {
			x.awakeEpoch = a.Epoch
			x.countAwake(a)
		}
	}
	x.updateTopKeys()
	x.noteDisagreements()
	x.noteSpent(role != "follower")
	x.epochs.Add(1)
}

// countAwake counts an epoch's visits and the keys it kept awake.
func (x *Exchanger) countAwake(a region.Awake) {
	x.met.visits.WithLabelValues("all").Add(float64(a.All))
	x.met.visits.WithLabelValues("timer").Add(float64(a.Timer))
	x.met.visits.WithLabelValues("touched").Add(float64(a.Touched))
	for r, n := range a.Kept[1:] {
		x.met.keptAwake.WithLabelValues(region.AwakeReasons[r+1]).Add(float64(n))
	}
}

// acquire takes or renews the region's hold and says what it learnt. The
// hold counts from before the call, less a margin, so that this replica
// stops writing before the store lets another replica take over (the store
// times it from later; monotonic clocks run at nearly the same rate). When
// the store does not answer, a holder carries on only while the hold it
// had is still safe.
func (x *Exchanger) acquire(ctx context.Context) region.Hold {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, x.cfg.StoreTimeout)
	defer cancel()
	hold, err := x.cfg.Coordinator.Acquire(ctx, x.cfg.Region, x.cfg.Replica, x.cfg.HoldTTL)
	if err != nil {
		x.met.storeErrors.WithLabelValues("hold").Inc()
		x.cfg.Logger.Warn("exchange: hold", "err", err)
		if x.node.Holding() && time.Now().Before(x.holdUntil) {
			return region.HoldRenewed
		}
		return region.HoldUnknown
	}
	if hold != region.HoldNone {
		x.holdUntil = sent.Add(x.cfg.HoldTTL - x.cfg.HoldTTL/10)
	}
	return hold
}

// noteHold logs and counts what Node.Hold did.
func (x *Exchanger) noteHold(ch region.HoldChange) {
	if ch.SteppedDown {
		why := "hold lost"
		if ch.Lapsed {
			why = "hold lapsed"
		}
		x.steppedDown(why)
	}
	switch {
	case ch.KeptOwn:
		clear(x.written)
		x.cfg.Logger.Warn("exchange: the store holds no newer exchange state than the one this replica dropped (it lost writes); keeping ours",
			"keys", x.node.Keys())
	case ch.TookOver:
		clear(x.written) // unknown until written again
		x.cfg.Logger.Info("exchange: running the region's exchange", "replica", x.cfg.Replica, "keys", x.node.Keys())
	case errors.Is(ch.Err, region.ErrMalformed) || errors.Is(ch.Err, region.ErrUnknownRegion):
		// Starting afresh could give twice what the lost state gave: stay a
		// follower until an operator repairs the store.
		x.met.storeErrors.WithLabelValues("restore").Inc()
		x.cfg.Logger.Error("exchange: the region's persisted state is unusable; not exchanging", "err", ch.Err)
	case ch.Err != nil:
		x.cfg.Logger.Warn("exchange: loading the region's state; retrying next epoch", "err", ch.Err)
	}
}

// steppedDown notes that this replica no longer runs the exchange.
func (x *Exchanger) steppedDown(why string) {
	clear(x.written)
	x.cfg.Logger.Info("exchange: no longer running the region's exchange", "replica", x.cfg.Replica, "why", why)
}

// holdCtx bounds a holder's store write by timeout and by the time its hold
// is safe: a write that would land after another replica may have taken
// over is never sent.
func (x *Exchanger) holdCtx(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	d := time.Now().Add(timeout)
	if x.holdUntil.Before(d) {
		d = x.holdUntil
	}
	return context.WithDeadline(ctx, d)
}
