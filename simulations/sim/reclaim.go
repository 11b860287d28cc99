package sim

import "math"

// A rule with partition_reclaim_after trades fail-static for utilisation:
// the regions that stop hearing one another reclaim each other's share, so
// the applied shares of the key may sum to more than PPM until every victim
// has heard of its reclaims. region's doc ("Partitions and reclaim") bounds
// the excess per silent region j by s_j − FloorPPM, and in a partition both
// sides reclaim: at most PPM − n × FloorPPM in all. That is this fault's
// E_fault (DESIGN.md): with the shares summing to at most 1 + e, the
// buckets hold at most b·(1+e), leases at most L·τ·(1+e), and refill runs at
// L·(1+e), so a window gains e·(b + L·τ) plus e·L per second it spends in
// the reclaim.

// openReclaim is the excess term of a partition on a key that reclaims,
// open until the partition has healed and the key's shares sum to at most
// PPM again.
type openReclaim struct {
	fault, key, span int
	healed           bool
}

// reclaimStart adds, for each key whose rule reclaims, the excess a
// partition of f starting at t may allow. Reclaims come after ReclaimAfter
// of silence counted from the last report heard, which may be a sync
// period and a delivery before the partition.
func (w *world) reclaimStart(fault int, t int64) {
	if w.alg != Escrow || len(w.rs) < 2 {
		return
	}
	e := lease1 - int64(len(w.rs))*w.rs[0].st.Config().FloorPPM
	if e <= 0 {
		return
	}
	frac := float64(e) / lease1
	for ki := range w.keys {
		k := &w.keys[ki]
		after := k.rule.PartitionReclaimAfter
		if after <= 0 {
			continue
		}
		lead := int64(w.sc.SyncPeriod + w.sc.Network.Delay + w.sc.Network.Jitter + 2*w.sc.Network.ClockSkew)
		km := &w.m.keys[ki]
		km.faults = append(km.faults, faultSpan{
			from:   max(t, t+int64(after)-lead),
			to:     math.MaxInt64,
			tokens: frac * (k.burst + k.rate*w.sc.LeaseTTL.Seconds()),
			rate:   frac * k.rate,
		})
		w.reclaims = append(w.reclaims, openReclaim{fault: fault, key: ki, span: len(km.faults) - 1})
	}
}

// reclaimHeal notes that the partition of fault has healed.
func (w *world) reclaimHeal(fault int) {
	for i := range w.reclaims {
		if w.reclaims[i].fault == fault {
			w.reclaims[i].healed = true
		}
	}
}

// checkReclaims closes, at t, the excess terms of healed partitions whose
// key's applied shares sum to at most PPM again: from then on buckets hold
// at most b, and the leases taken before run out within τ (2τ: a lease's
// expiry is counted from its send time).
func (w *world) checkReclaims(t int64) {
	out := w.reclaims[:0]
	for _, o := range w.reclaims {
		if o.healed && w.shareSum(o.key) <= lease1 {
			f := &w.m.keys[o.key].faults[o.span]
			f.to = t + 2*int64(w.sc.LeaseTTL)
			if f.to <= f.from {
				// Healed before anyone could have been silent for
				// ReclaimAfter: nothing was reclaimed.
				f.tokens, f.rate = 0, 0
			}
			continue
		}
		out = append(out, o)
	}
	w.reclaims = out
}

// shareSum is Σ over regions of key ki's applied share.
func (w *world) shareSum(ki int) int64 {
	var sum int64
	for _, r := range w.rs {
		sum += max(0, w.share(r, r.store, w.keys[ki].storeKey))
	}
	return sum
}
