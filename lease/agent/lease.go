package agent

import (
	"context"
	"fmt"
	"time"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// maxBatch is the most items one Lease or Return call carries (regiond's
// default MaxItems).
const maxBatch = 1000

// leaseCall runs flight f: one Lease call for all its keys, bounded by
// timeout, then applies the grants and wakes whoever waits for f.
func (a *Agent) leaseCall(f *flight, timeout time.Duration) {
	sent := a.now()
	req, wants := a.leaseRequest(f, sent)

	ctx, cancel := context.WithTimeout(a.calls, timeout)
	start := time.Now()
	resp, err := a.client.Lease(ctx, req)
	cancel()
	rtt := time.Since(start)
	if err = a.leaseDone(f, req, wants, sent, a.now(), rtt, resp, err); err != nil {
		a.cfg.Logger.Debug("lease call failed", "items", len(f.keys), "err", err)
	}
}

// leaseDone applies the outcome of flight f's Lease call req, sent at sent
// and answered (resp) or failed (err) at now after a round trip of rtt:
// the breaker and the round-trip estimate learn from it, each key gets its
// grant or, on an error, reports its demand again with its next call and
// is checked again after the probe interval, and whoever waits for f is
// woken. It returns the call's error, which includes an answer with the
// wrong number of grants. The Agent and the simulator's Driver both
// complete their calls through it.
func (a *Agent) leaseDone(f *flight, req *leasev1.LeaseRequest, wants []int64, sent, now int64, rtt time.Duration, resp *leasev1.LeaseResponse, err error) error {
	if err == nil && len(resp.GetGrants()) != len(f.keys) {
		err = fmt.Errorf("agent: region answered %d grants for %d items", len(resp.GetGrants()), len(f.keys))
	}
	a.ctr.leaseCalls.Add(1)
	a.ctr.leaseItems.Add(int64(len(f.keys)))
	a.callDone(now, err == nil)
	if err == nil {
		a.lead.Store(int64(a.rtt.record(rtt) + a.margin))
		a.agents.Store(max(int64(resp.GetAgents()), 1))
	} else {
		a.ctr.callErrors.Add(1)
	}
	for i, k := range f.keys {
		k.mu.Lock()
		if err == nil {
			a.applyLocked(k, f.rules[i], resp.Grants[i], sent, now, wants[i])
		} else {
			// Report this demand with the next call instead.
			k.reportedAsked -= req.Items[i].Demand
			k.reportedAdmitted -= req.Items[i].Admitted
			a.scheduleBy(k, now+int64(a.cfg.ProbeInterval))
		}
		if k.flight == f {
			k.flight = nil
		}
		k.queued.Store(false)
		k.mu.Unlock()
	}
	f.err = err
	close(f.done)
	return err
}

// applyLocked applies one grant to k (k.mu held). sent is when the request
// was sent: the lease expires TTL after it, never after the reply.
func (a *Agent) applyLocked(k *keyState, r *policy.Rule, g *leasev1.LeaseGrant, sent, now, want int64) {
	granted := max(g.GetGranted(), 0)
	ttl := a.cfg.LeaseTTL
	if d := g.GetTtl(); d != nil && d.AsDuration() > 0 {
		ttl = d.AsDuration()
	}
	exp := sent + int64(ttl)
	k.granted += granted
	a.ctr.granted.Add(granted)
	if k.evicted.Load() {
		// Closed or evicted meanwhile: nobody will spend these.
		a.dropLocked(k, granted)
		return
	}
	if granted > 0 {
		if exp > now {
			a.dropLocked(k, k.slots.install(now, exp, granted))
			if granted >= cacheMinLease && len(a.stripes) > 1 {
				k.batch.Store(max(granted/int64(4*len(a.stripes)), 1))
				if k.cache.Load() == nil {
					k.cache.Store(&stripeCache{e: make([]cacheEntry, len(a.stripes))})
				}
			}
		} else {
			a.dropLocked(k, granted) // the round trip outlasted the TTL
		}
	}
	a.dropLocked(k, k.collect(now))
	k.hasGrant = true
	k.regionRate, k.capacity = g.GetRate(), g.GetCapacity()
	k.remaining.Store(int64(min(max(g.GetRemaining(), 0), maxLeaseTokens)))
	k.fallback.active = false

	lead := a.lead.Load()
	k.lowWater.Store(lowWater(k.rate.rate, time.Duration(lead), r.Cost))
	hold := holdAfter(granted, want, int64(g.GetRetryAfter().AsDuration()), int64(a.cfg.LeasePeriod), k.regionRate, k.capacity)
	if hold > 0 {
		k.denyUntil.Store(now + hold)
	} else {
		k.denyUntil.Store(0)
	}
	if granted > 0 && exp > now {
		a.scheduleAt(k, exp-a.renewLead())
	} else {
		a.scheduleAt(k, now+max(hold, int64(a.cfg.LeasePeriod)))
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
func (a *Agent) dropLocked(k *keyState, n int64) {
	if n > 0 {
		k.dropped += n
		a.ctr.dropped.Add(n)
	}
}

// returnBatch gathers tokens to give back to the region.
type returnBatch struct {
	items []*leasev1.ReturnItem
	keys  []*keyState
}

func (b *returnBatch) add(k *keyState, n int64) {
	if n > 0 {
		b.items = append(b.items, &leasev1.ReturnItem{Rule: k.rule, Key: k.key, Tokens: n})
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

// sendReturns returns b's tokens in calls of at most maxBatch items and
// empties b.
func (a *Agent) sendReturns(ctx context.Context, b *returnBatch) {
	for len(b.items) > 0 {
		call := b.next()
		_, err := a.client.Return(ctx, &leasev1.ReturnRequest{Agent: a.id, Items: call.items})
		if err = a.returnDone(&call, err); err != nil {
			a.cfg.Logger.Debug("return call failed", "items", len(call.items), "err", err)
		}
	}
	b.items, b.keys = nil, nil
}

// returnDone counts the outcome of a Return call of b: the tokens of a
// failed call are counted as dropped (the region may or may not have them
// back; either way nobody here will spend them). It returns err. The Agent
// and the simulator's Driver both complete their returns through it.
func (a *Agent) returnDone(b *returnBatch, err error) error {
	a.ctr.returnCalls.Add(1)
	a.ctr.returnItems.Add(int64(len(b.items)))
	for i, it := range b.items {
		if err == nil {
			a.ctr.returned.Add(it.Tokens)
			continue
		}
		k := b.keys[i]
		k.mu.Lock()
		k.returned -= it.Tokens
		a.dropLocked(k, it.Tokens)
		k.mu.Unlock()
	}
	if err != nil {
		a.ctr.callErrors.Add(1)
	}
	return err
}

// leaseRequest builds the Lease call of flight f sent at sent: it sizes each
// key's lease and reports the demand since the key's last report. The Agent
// and the simulator's Driver both send what it builds.
func (a *Agent) leaseRequest(f *flight, sent int64) (*leasev1.LeaseRequest, []int64) {
	lead := time.Duration(a.lead.Load())
	agents := a.agents.Load()
	req := &leasev1.LeaseRequest{Agent: a.id, Items: make([]*leasev1.LeaseItem, len(f.keys))}
	wants := make([]int64, len(f.keys))
	for i, k := range f.keys {
		r := f.rules[i]
		k.mu.Lock()
		asked := k.askedLocked()
		k.rate.observe(sent, asked, a.params)
		capacity := k.capacity
		if !k.hasGrant {
			capacity = float64(r.Burst)
		}
		wants[i] = leaseSize(k.rate.rate, a.cfg.LeasePeriod, lead, f.needs[i], r.Cost, capacity, agents, k.lastWant)
		k.lastWant = wants[i]
		admitted := asked - k.denied.Load()
		demand := max(asked-k.reportedAsked, 0)
		req.Items[i] = &leasev1.LeaseItem{
			Rule:     k.rule,
			Key:      k.key,
			Want:     wants[i],
			Demand:   demand,
			Admitted: min(max(admitted-k.reportedAdmitted, 0), demand),
		}
		k.reportedAsked, k.reportedAdmitted = asked, admitted
		k.mu.Unlock()
	}
	return req, wants
}
