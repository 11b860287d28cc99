package agent

import (
	"fmt"
	"math"
	"time"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// maxBatch is the most items one Lease or Return call carries (regiond's
// default MaxItems).
const maxBatch = 1000

// leaseDone applies the outcome of flight f's Lease call req, sent at sent
// and answered (resp) or failed (err) at now after a round trip of rtt:
// the breaker and the round-trip estimate learn from it, each key gets its
// grant or, on an error, reports its demand again with its next call
// (unless the error says the region counted it) and is checked again
// after the probe interval, and whoever waits for f is
// woken. It returns the call's error, which includes an answer with the
// wrong number of grants.
func (c *core) leaseDone(f *flight, req *leasev1.LeaseRequest, wants []int64, sent, now int64, rtt time.Duration, resp *leasev1.LeaseResponse, err error) error {
	if err == nil && len(resp.GetGrants()) != len(f.keys) {
		err = fmt.Errorf("agent: region answered %d grants for %d items", len(resp.GetGrants()), len(f.keys))
	}
	c.ctr.leaseCalls.Add(1)
	c.ctr.leaseItems.Add(int64(len(f.keys)))
	c.callDone(now, err == nil)
	if err == nil {
		c.lead.Store(int64(c.rtt.record(rtt) + c.margin))
		c.agents.Store(max(int64(resp.GetAgents()), 1))
	} else {
		c.ctr.callErrors.Add(1)
	}
	// The region counted the demand of a call its store failed.
	counted := err != nil && leasev1.DemandCounted(err)
	for i, k := range f.keys {
		k.mu.Lock()
		// What the requests waiting for this round trip need beyond its
		// grant, when the grant was all it asked for (else the region ran
		// dry, and the deny cache holds them off): the key's next lease
		// asks for it.
		joined, unserved := k.joinedLocked(), int64(0)
		if err == nil {
			if g := max(resp.Grants[i].GetGranted(), 0); g >= wants[i] {
				unserved = max(f.needs[i]+joined-g, 0)
			}
		}
		k.setUnservedLocked(unserved, now)
		if err == nil {
			c.applyLocked(k, f.rules[i], resp.Grants[i], sent, now, wants[i])
		} else {
			if !counted {
				// Report this demand with the next call instead.
				k.reportedAsked -= req.Items[i].Demand
				k.reportedAdmitted -= req.Items[i].Admitted
			}
			c.scheduleBy(k, now+int64(c.cfg.ProbeInterval))
		}
		if k.flight == f {
			k.flight = nil
		}
		k.flags.set(flagQueued, false)
		k.mu.Unlock()
	}
	f.err = err
	close(f.done)
	return err
}

// applyLocked applies one grant to k (k.mu held). sent is when the request
// was sent: the lease expires TTL after it, never after the reply.
func (c *core) applyLocked(k *keyState, r *policy.Rule, g *leasev1.LeaseGrant, sent, now, want int64) {
	granted := max(g.GetGranted(), 0)
	ttl := c.cfg.LeaseTTL
	if d := g.GetTtl(); d != nil && d.AsDuration() > 0 {
		ttl = d.AsDuration()
	}
	exp := sent + int64(ttl)
	k.net += granted
	c.ctr.granted.Add(granted)
	if c.onGrant != nil && granted > 0 {
		c.onGrant(c.rules.of(r).name, granted)
	}
	if k.isEvicted() {
		// Closed or evicted meanwhile: nobody will spend these.
		c.dropLocked(k, granted)
		return
	}
	if granted > 0 {
		if exp > now {
			c.dropLocked(k, k.slots.install(now, exp, granted))
			if granted >= cacheMinLease && len(c.stripes) > 1 {
				rs := k.rareLocked()
				sc := rs.cache.Load()
				if sc == nil {
					sc = &stripeCache{e: make([]cacheEntry, len(c.stripes))}
					rs.cache.Store(sc)
				}
				sc.batch.Store(max(granted/int64(4*len(c.stripes)), 1))
			}
		} else {
			c.dropLocked(k, granted) // the round trip outlasted the TTL
		}
	}
	c.dropLocked(k, k.collect(now))
	if e := k.fallback(); e != nil && e.active {
		// The region answers: the emergency bucket is idle again, as of
		// the rate it ran at.
		rate, start, capacity := c.emergencyParams(k, r, r.Cost)
		e.idle(now, rate, start, capacity)
	}
	k.setGrantLocked(g.GetRate(), g.GetCapacity(), ttl)
	k.remaining.Store(math.Float32bits(float32(min(max(g.GetRemaining(), 0), maxLeaseTokens))))

	lead := c.lead.Load()
	k.lowWater.Store(int32(min(lowWater(float64(k.rate.rate), time.Duration(lead), r.Cost), math.MaxInt32)))
	hold := holdAfter(granted, want, int64(g.GetRetryAfter().AsDuration()), int64(c.cfg.LeasePeriod), g.GetRate(), g.GetCapacity())
	if hold > 0 {
		k.rareLocked() // before the deny cache entry: see keyRare.denied
		du := now + hold
		if r.FixedWindow() {
			// A deny cache entry never outlives its window (by this
			// agent's clock): the next window is whole.
			_, end := c.windowAt(r, c.windowOf(r), now)
			du = min(du, end)
		}
		k.denyUntil.Store(du)
	} else {
		k.denyUntil.Store(0)
	}
	if granted > 0 && exp > now {
		// Checked before the first of its leases expires, not the new one:
		// an older lease's tokens go back then rather than expire.
		c.scheduleAt(k, k.firstExpiry(now)-c.renewLead())
	} else {
		c.scheduleAt(k, now+max(hold, int64(c.cfg.LeasePeriod)))
	}
}

// holdAfter is how long a key must not ask again once its tokens are gone,
// after a grant of granted out of want (nanoseconds; 0: ask at once).
//
// A grant of zero holds at least the region's retryAfter (the deny cache).
// A grant short of want means the region's bucket ran dry; asking again at
// once would fetch only what trickled in since, one round trip per few
// tokens. Holding off for the unfilled part of a lease period lets the
// bucket refill and the next grant carry a batch again. This never costs
// admissions while the bucket can hold what refills meanwhile, so the hold
// is capped at half the time the bucket takes to fill.
func holdAfter(granted, want, retryAfter, period int64, rate, capacity float64) int64 {
	if granted >= want {
		return 0
	}
	hold := int64(float64(period) * (1 - float64(granted)/float64(want)))
	if rate > 0 {
		hold = min(hold, int64(capacity/rate*1e9/2))
	}
	if granted == 0 {
		hold = max(hold, retryAfter)
	}
	return max(hold, 0)
}

// dropLocked counts n tokens of k dropped (expired unspent, or lost).
func (c *core) dropLocked(k *keyState, n int64) {
	if n > 0 {
		k.net -= n
		c.ctr.dropped.Add(n)
	}
}

// returnBatch gathers tokens to give back to the region.
type returnBatch struct {
	items []*leasev1.ReturnItem
	keys  []*keyState
}

func (b *returnBatch) add(k *keyState, n int64) {
	if n > 0 {
		b.items = append(b.items, &leasev1.ReturnItem{Rule: k.rule(), Key: k.key(), Tokens: n})
		b.keys = append(b.keys, k)
	}
}

// next removes and returns the first call's worth of b: at most maxBatch
// items.
func (b *returnBatch) next() returnBatch {
	n := min(len(b.items), maxBatch)
	first := returnBatch{items: b.items[:n:n], keys: b.keys[:n:n]}
	b.items, b.keys = b.items[n:], b.keys[n:]
	return first
}

// returnDone counts the outcome of a Return call of b: the tokens of a
// failed call are counted as dropped (the region may or may not have them
// back; either way nobody here will spend them). It returns err.
func (c *core) returnDone(b *returnBatch, err error) error {
	c.ctr.returnCalls.Add(1)
	c.ctr.returnItems.Add(int64(len(b.items)))
	for i, it := range b.items {
		if err == nil {
			c.ctr.returned.Add(it.Tokens)
			continue
		}
		k := b.keys[i]
		k.mu.Lock()
		k.net += it.Tokens // not returned after all, but dropped
		c.dropLocked(k, it.Tokens)
		k.mu.Unlock()
	}
	if err != nil {
		c.ctr.callErrors.Add(1)
	}
	return err
}

// leaseRequest builds the Lease call of flight f sent at sent: it sizes each
// key's lease and reports the demand since the key's last report.
func (c *core) leaseRequest(f *flight, sent int64) (*leasev1.LeaseRequest, []int64) {
	lead := time.Duration(c.lead.Load())
	agents := c.agents.Load()
	req := &leasev1.LeaseRequest{Agent: c.id, Items: make([]*leasev1.LeaseItem, len(f.keys))}
	wants := make([]int64, len(f.keys))
	for i, k := range f.keys {
		r := f.rules[i]
		k.mu.Lock()
		asked := k.askedLocked()
		k.rate.observe(sent, asked, c.params)
		capacity := float64(k.capacity)
		if !k.flags.has(flagGranted) {
			capacity = float64(r.Burst)
		}
		var waiting int64
		rs := k.rare.Load()
		if rs != nil && sent-rs.unservedAt <= int64(c.cfg.RoundTripTimeout) {
			waiting = rs.unserved // they are about to ask again, or are asking
		}
		want := leaseSize(float64(k.rate.rate), c.cfg.LeasePeriod, lead, f.needs[i], waiting, r.Cost, capacity, agents, int64(k.lastWant))
		// The size before a window's end clips it caps the next lease, so
		// that the next window's leases do not start small.
		k.lastWant = float32(want)
		if rs != nil {
			rs.unserved = 0
		}
		if r.FixedWindow() {
			want = c.windowLease(r, sent, want, float64(k.rate.rate), lead, f.needs[i], waiting)
		}
		wants[i] = want
		admitted := asked - k.denied()
		if f.sync {
			// The asking request is not decided yet, so not counted in
			// asked: report it now (a cold key's first call would carry
			// no demand, and the region would hear of it a call later).
			// asked catches up with the report once it is decided.
			asked += f.needs[i]
		}
		demand := max(asked-k.reportedAsked, 0)
		req.Items[i] = &leasev1.LeaseItem{
			Rule:     k.rule(),
			Key:      k.key(),
			Want:     wants[i],
			Demand:   demand,
			Admitted: min(max(admitted-k.reportedAdmitted, 0), demand),
		}
		k.reportedAsked, k.reportedAdmitted = asked, admitted
		k.mu.Unlock()
	}
	return req, wants
}
