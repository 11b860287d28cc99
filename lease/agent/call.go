package agent

import (
	"errors"
	"time"

	leasev1 "github.com/ration-dev/ration/lease/v1"
)

// Call is a Lease or Return call the agent's core needs carried to the
// region: the Agent sends it over gRPC, a Driver hands it to its caller.
// Exactly one of Lease and Return is set.
type Call struct {
	Lease  *leasev1.LeaseRequest
	Return *leasev1.ReturnRequest
	// Sent is when the call was sent; Timeout how long the agent waits for
	// its answer. An answer later than Sent + Timeout must be dropped and
	// the call completed with an error at Sent + Timeout instead.
	Sent    time.Duration
	Timeout time.Duration

	sent      int64
	f         *flight
	wants     []int64
	rets      *returnBatch
	refresher bool // the refresher's: it makes no other call until this one completes
	completed bool // for the Driver, which ignores later completions
}

// ErrCallTimeout is a convenient error for Driver.Complete when a call's
// answer did not arrive within its Timeout.
var ErrCallTimeout = errors.New("agent: call timed out")

// leaseCall makes the Lease call of flight f sent at sent: it sizes each
// key's lease and reports the demand since the key's last report.
func (c *core) leaseCall(f *flight, sent int64, timeout time.Duration, refresher bool) *Call {
	req, wants := c.leaseRequest(f, sent)
	return &Call{Lease: req, Sent: time.Duration(sent), Timeout: timeout, sent: sent, f: f, wants: wants, refresher: refresher}
}

// roundTrip makes the Lease call of a request's own flight f (from
// slowAttempt), sent at sent.
func (c *core) roundTrip(f *flight, sent int64) *Call {
	return c.leaseCall(f, sent, c.cfg.RoundTripTimeout, false)
}

// returnCall makes the next Return call of b, sent at sent: at most
// maxBatch of its items, which it removes from b. It returns nil when b is
// empty.
func (c *core) returnCall(b *returnBatch, sent int64, timeout time.Duration, refresher bool) *Call {
	if len(b.items) == 0 {
		return nil
	}
	rets := b.next()
	return &Call{
		Return:    &leasev1.ReturnRequest{Agent: c.id, Items: rets.items},
		Sent:      time.Duration(sent),
		Timeout:   timeout,
		sent:      sent,
		rets:      &rets,
		refresher: refresher,
	}
}

// complete applies the outcome of call at now, when its answer arrived
// (resp for a Lease call, nil for a Return) or failed (err), after a round
// trip of rtt. It returns the call's error, which includes a Lease answer
// with the wrong number of grants.
func (c *core) complete(call *Call, now int64, rtt time.Duration, resp *leasev1.LeaseResponse, err error) error {
	if call.Lease != nil {
		err = c.leaseDone(call.f, call.Lease, call.wants, call.sent, now, rtt, resp, err)
	} else {
		err = c.returnDone(call.rets, err)
	}
	if call.refresher && c.ref.busy == call {
		c.ref.busy = nil
	}
	return err
}
