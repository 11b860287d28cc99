package agent

import (
	"context"
	"time"
)

// refreshLoop is the Agent's refresher goroutine: it wakes when a key is
// queued and on every tick, and makes the core's refresher calls one after
// the other, each carried within its Timeout and calls. It stops when run
// is done, after the wake-up in progress.
func (a *Agent) refreshLoop(run, calls context.Context) {
	defer a.wg.Done()
	tick := time.NewTicker(a.c.tick())
	defer tick.Stop()
	for {
		select {
		case <-run.Done():
			return
		case <-a.c.woken():
		case <-tick.C:
		}
		a.anchorWall()
		a.c.planWakeUp(a.now())
		for call := a.c.nextRefresherCall(a.now()); call != nil; call = a.c.nextRefresherCall(a.now()) {
			a.carryWithin(calls, call)
		}
	}
}

// carryWithin carries call within its Timeout and parent.
func (a *Agent) carryWithin(parent context.Context, call *Call) {
	ctx, cancel := context.WithTimeout(parent, call.Timeout)
	defer cancel()
	a.carry(ctx, call)
}

// carry sends call to the region within ctx and hands its outcome back to
// the core. It returns the call's error.
func (a *Agent) carry(ctx context.Context, call *Call) error {
	if call.Lease == nil {
		_, err := a.client.Return(ctx, call.Return)
		if err = a.c.complete(call, a.now(), 0, nil, err); err != nil {
			a.cfg.Logger.Debug("return call failed", "items", len(call.Return.Items), "err", err)
		}
		return err
	}
	start := time.Now()
	resp, err := a.client.Lease(ctx, call.Lease)
	rtt := time.Since(start)
	if err = a.c.complete(call, a.now(), rtt, resp, err); err != nil {
		a.cfg.Logger.Debug("lease call failed", "items", len(call.Lease.Items), "err", err)
	}
	return err
}
