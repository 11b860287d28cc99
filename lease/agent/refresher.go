package agent

import "github.com/ration-dev/ration/policy"

// The refresher keeps leases ahead of demand. It wakes when a spend leaves
// a key below its low-water mark, and on a tick for keys whose scheduled
// check is due (a lease about to expire, a key that may have gone idle).
// A wake-up plans its calls (planWakeUp): the keys that need a lease, in
// Lease calls of at most maxBatch keys, then the tokens to give back, in
// Return calls. It makes them one at a time (nextRefresherCall), each once
// the previous one has completed, and the next wake-up waits until the
// last one has. The Agent's refresher goroutine and the Driver both follow
// this sequence; only who carries the calls and moves time differs.

// refresher is the core's refresher: its planned calls and the one in
// flight. It belongs to one goroutine (the Agent's refresher, or the
// Driver's caller).
type refresher struct {
	busy  *Call // the call in flight, nil when none
	steps []refresherStep
	work  []*keyState // spare room for the keys a wake-up takes
}

// refresherStep is what a wake-up still has to send: a lease call for keys
// (in batches of maxBatch), or returns.
type refresherStep struct {
	pol  *policy.Set
	keys []*keyState
	rets *returnBatch
}

// refresherBusy reports whether the refresher waits for a call or still has
// calls of its last wake-up to make: a new wake-up must wait.
func (c *core) refresherBusy() bool { return c.ref.busy != nil || len(c.ref.steps) > 0 }

// planWakeUp is a wake-up of the refresher at now: it checks the queued and
// due keys (planRefresh) and plans the calls that nextRefresherCall makes.
// The refresher must not be busy.
func (c *core) planWakeUp(now int64) {
	rets := &returnBatch{}
	pol, renew, work := c.planRefresh(now, c.ref.work[:0], rets)
	c.ref.work = work
	if len(renew) > 0 {
		c.ref.steps = append(c.ref.steps, refresherStep{pol: pol, keys: renew})
	}
	if len(rets.items) > 0 {
		c.ref.steps = append(c.ref.steps, refresherStep{rets: rets})
	}
}

// nextRefresherCall returns the refresher's next call, sent at now, or nil
// when none is due: one is in flight (complete frees the refresher), or the
// wake-up has made all its calls. Keys renewed by a batch are taken when
// its call is made, so that a key that gained a round trip of its own
// meanwhile is left out (renewBatch).
func (c *core) nextRefresherCall(now int64) *Call {
	for c.ref.busy == nil && len(c.ref.steps) > 0 {
		st := &c.ref.steps[0]
		var call *Call
		if st.rets != nil {
			call = c.returnCall(st.rets, now, c.cfg.RefreshTimeout, true)
			if len(st.rets.items) == 0 {
				c.popStep()
			}
		} else {
			var f *flight
			f, st.keys = c.renewBatch(st.pol, st.keys)
			if len(st.keys) == 0 {
				c.popStep()
			}
			if f != nil {
				call = c.leaseCall(f, now, c.cfg.RefreshTimeout, true)
			}
		}
		if call != nil {
			c.ref.busy = call
			return call
		}
	}
	return nil
}

func (c *core) popStep() {
	c.ref.steps[0] = refresherStep{}
	c.ref.steps = c.ref.steps[1:]
}
