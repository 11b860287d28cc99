package sim

import (
	"math"

	"github.com/ration-dev/ration/region"
)

// A rule with partition_reclaim_after trades fail-static for utilisation:
// a region that has not heard another for that long reclaims part of its
// share, so the applied shares of the key may sum to more than PPM until
// the victim hears of it. region's doc ("Partitions and reclaim") bounds
// the excess per silent region j by s_j − FloorPPM, and in a partition both
// sides reclaim: at most e = PPM − n × FloorPPM in all. That is this
// fault's E_fault (DESIGN.md): with the shares summing to at most 1 + e,
// the buckets hold at most b·(1+e), leases at most L·τ·(1+e), and refill
// runs at L·(1+e), so a window gains e·(b + L·τ) plus e·L per second it
// spends in the reclaim. A fixed window gains e·limit: it does not refill,
// and a region that enters it at a reclaimed share fills that much more.
//
// Silence comes from partitions, but also from reports lost in a row, so
// the term is opened by the reclaims themselves: when a share written for
// a key that may reclaim takes the key's shares above PPM, which no gift
// ever does (nor a rewrite, but of share a reclaim took that a restored
// state has not heard of yet). It closes once they sum to at most PPM again, plus 2τ for the
// leases taken before (a lease's expiry is counted from its send time).

// noteReclaims opens, at t, the reclaim term of the keys among cs (shares
// a region just wrote) whose rule reclaims and whose shares now sum to more
// than PPM. A raise the keeper kept counts from the write on (the grant
// that carries it refills the bucket since then), not from the grant.
func (w *world) noteReclaims(cs []region.ShareChange, t int64) {
	if w.alg != Escrow || len(w.reclaimKeys) == 0 {
		return
	}
	for _, c := range cs {
		ki, ok := w.reclaimKeys[c.Key]
		if !ok || w.reclaimOpen[ki] || w.shareSum(ki) <= region.PPM {
			continue
		}
		w.openReclaim(ki, t)
	}
}

func (w *world) openReclaim(ki int, t int64) {
	e := region.PPM - int64(len(w.rs))*w.rs[0].node.Config().FloorPPM
	frac := float64(max(e, 0)) / region.PPM
	k := &w.keys[ki]
	o := openTerm{fault: -1, region: -1, healed: true, tail: 2 * int64(w.sc.LeaseTTL)}
	span := faultSpan{from: t, to: math.MaxInt64, tokens: frac * (k.burst + k.rate*w.sc.LeaseTTL.Seconds()), rate: frac * k.rate}
	if k.rule.FixedWindow() {
		// A window does not refill, and its leases end with it: a region
		// entering a window at a reclaimed share fills at most e × limit
		// more.
		span.tokens, span.rate = frac*k.burst, 0
	}
	w.addTerm(&o, ki, span, false)
	o.over = func() bool {
		if w.shareSum(ki) > region.PPM {
			return false
		}
		delete(w.reclaimOpen, ki)
		return true
	}
	w.reclaimOpen[ki] = true
	w.terms = append(w.terms, o)
}

// shareSum is Σ over regions of key ki's applied share, as the buckets
// see it (keyShare).
func (w *world) shareSum(ki int) int64 {
	var sum int64
	for _, r := range w.rs {
		sum += max(0, w.keyShare(r, w.keys[ki].storeKey))
	}
	return sum
}
