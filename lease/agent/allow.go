package agent

import (
	"context"

	"github.com/ration-dev/ration/policy"
)

// Allow decides one request described by ds, spending hits × cost tokens of
// every rule that matches (hits below 1 count as 1). Every matching rule
// must allow; tokens are taken only when all do.
//
// A request whose keys hold leased tokens is decided with atomics on local
// memory, allocating nothing. A key without tokens costs one synchronous
// round trip bounded by RoundTripTimeout; while the region is unreachable
// each rule's on_error decides. ctx bounds only that round trip's wait.
func (a *Agent) Allow(ctx context.Context, ds []policy.Descriptor, hits int64) (d Decision) {
	now := a.now()
	s := a.scratch.Get().(*scratch)
	// The decision is written in place, into the result, rather than
	// copied back up through each call: on this path the copies cost more
	// than the arithmetic.
	if a.c.decideLocal(&d, s, now, ds, hits) {
		a.c.finishInto(&d, s, a.slowPath(ctx, s, now))
	}
	// One decision in 64 per stripe is timed for the latency histogram.
	if n := a.c.count(s, d.Path, d.Allowed); n%64 == 0 && a.latency != nil {
		a.latency.Observe(float64(a.now()-now) / 1e9)
	}
	s.synced = false
	a.scratch.Put(s)
	return d
}

// slowPath decides the rules that decideLocal could not: keys without
// tokens and without a deny cache entry. Each attempt makes one round trip
// for all of them (joining a round trip already in flight for a key, so
// that one key never has two); the request waits at most RoundTripTimeout
// in all, and each rule's failure mode decides when the region cannot
// answer in time. It returns the time after the wait.
//
// What is decided is the core's (slowAttempt and slowSettle, which the
// Driver runs too); this function only sends the call and waits.
func (a *Agent) slowPath(ctx context.Context, s *scratch, now int64) int64 {
	wctx, cancel := context.WithTimeout(ctx, a.cfg.RoundTripTimeout)
	defer cancel()
	for n := 0; ; n++ {
		own, decided := a.c.slowAttempt(s, n, now)
		if decided {
			return now
		}
		if own != nil {
			// Other requests may join this round trip: the request's ctx
			// must not cancel it.
			a.carryWithin(context.Background(), a.c.roundTrip(own, a.now()))
		}
		await(wctx, s)
		now = a.now()
		if a.c.slowSettle(s, now, wctx.Err() != nil) {
			return now
		}
	}
}

// await blocks until every round trip s waits for is done, or ctx is.
func await(ctx context.Context, s *scratch) {
	for f := s.awaited(); f != nil; f = s.awaited() {
		select {
		case <-f.done:
		case <-ctx.Done():
			return
		}
	}
}
