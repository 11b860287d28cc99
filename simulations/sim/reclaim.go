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

// reclaimStart adds, for each key whose rule reclaims, the excess a
// partition (fault) starting at t may allow. Reclaims come after
// ReclaimAfter of silence counted from the last report heard, which may be
// a sync period and a delivery before the partition. The term lasts until
// the partition has healed and the key's applied shares sum to at most PPM
// again: from then on buckets hold at most b, and the leases taken before
// run out within τ (2τ: a lease's expiry is counted from its send time).
func (w *world) reclaimStart(fault int, t int64) {
	if w.alg != Escrow || len(w.rs) < 2 {
		return
	}
	e := lease1 - int64(len(w.rs))*w.rs[0].st.Config().FloorPPM
	if e <= 0 {
		return
	}
	frac := float64(e) / lease1
	lead := int64(w.sc.SyncPeriod + w.sc.Network.Delay + w.sc.Network.Jitter + 2*w.sc.Network.ClockSkew)
	o := openTerm{fault: fault, region: -1, tail: 2 * int64(w.sc.LeaseTTL)}
	var keys []int
	for ki := range w.keys {
		k := &w.keys[ki]
		after := k.rule.PartitionReclaimAfter
		if after <= 0 {
			continue
		}
		keys = append(keys, ki)
		w.addTerm(&o, ki, faultSpan{
			from:   max(t, t+int64(after)-lead),
			to:     math.MaxInt64,
			tokens: frac * (k.burst + k.rate*w.sc.LeaseTTL.Seconds()),
			rate:   frac * k.rate,
		}, false)
	}
	if len(keys) == 0 {
		return
	}
	o.over = func() bool {
		for _, ki := range keys {
			if w.shareSum(ki) > lease1 {
				return false
			}
		}
		return true
	}
	w.terms = append(w.terms, o)
}

// shareSum is Σ over regions of key ki's applied share.
func (w *world) shareSum(ki int) int64 {
	var sum int64
	for _, r := range w.rs {
		sum += max(0, w.share(r, r.store, w.keys[ki].storeKey))
	}
	return sum
}
