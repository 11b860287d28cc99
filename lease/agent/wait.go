package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ration-dev/ration/policy"
)

// ErrExceedsBurst is wrapped by Wait's error when the request needs more
// tokens (hits × cost) than an enforced rule's burst: no bucket can ever
// hold them, so waiting cannot help. Wait returns it at once, with the
// denial.
var ErrExceedsBurst = errors.New("agent: request exceeds the rule's burst")

// ErrWouldExceedDeadline is wrapped by Wait's error when the quota denies
// the request for longer than ctx's deadline leaves: the denial's
// RetryAfter ends after the deadline, so waiting cannot succeed in time.
// Wait returns it at once, with the denial; the error wraps
// context.DeadlineExceeded too, as the deadline is what it could not meet.
var ErrWouldExceedDeadline = errors.New("agent: wait would exceed the context's deadline")

// Wait is Allow for producers that would rather queue than be rejected: it
// blocks until the request is allowed, ctx is done (returning the last
// denial and ctx's error) or the agent is shut down (ErrClosed). It waits
// each denial's RetryAfter, and a growing backoff when a denial gives none.
//
// Like x/time/rate's Limiter.WaitN, it fails fast where waiting cannot
// succeed, returning the denial at once with an error wrapping
// ErrExceedsBurst (more tokens than an enforced rule's burst) or
// ErrWouldExceedDeadline (the quota denies the request past ctx's
// deadline). A denial by a failure mode (FALLBACK_LOCAL, FAILED_CLOSED)
// never fails fast on the deadline: the region may come back sooner than
// any estimate, so Wait retries at least every ProbeInterval until ctx is
// done. Shadow rules never make Wait wait or fail.
func (a *Agent) Wait(ctx context.Context, ds []policy.Descriptor, hits int64) (Decision, error) {
	w := waitLoop{
		done:    a.done,
		backoff: time.Millisecond, maxBackoff: a.cfg.LeasePeriod, probe: a.cfg.ProbeInterval,
		allow: func() (Decision, *policy.Rule, error) {
			if a.shut.Load() {
				return Decision{}, nil, ErrClosed
			}
			d := a.Allow(ctx, ds, hits)
			return d, a.c.policy().Rule(d.Rule), nil
		},
	}
	return w.run(ctx, hits)
}

// waitLoop is Wait without the agent: allow decides one attempt and names
// the deciding rule as the policy now has it (nil for none), and done is
// closed when the agent shuts down. Its timers are real time (the test
// runs it in a synctest bubble).
type waitLoop struct {
	done                chan struct{}
	backoff, maxBackoff time.Duration
	probe               time.Duration
	allow               func() (Decision, *policy.Rule, error)
}

func (w *waitLoop) run(ctx context.Context, hits int64) (Decision, error) {
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		d, r, err := w.allow()
		if err != nil || d.Allowed {
			return d, err
		}
		left, bounded := time.Duration(0), false
		if dl, ok := ctx.Deadline(); ok {
			left, bounded = time.Until(dl), true
		}
		wait, err := waitAfter(d, r, hits, left, bounded, w.probe)
		if err != nil {
			return d, err
		}
		if wait <= 0 {
			wait = w.backoff
			w.backoff = min(2*w.backoff, w.maxBackoff)
		}
		if t == nil {
			t = time.NewTimer(wait)
		} else {
			t.Reset(wait)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return d, ctx.Err()
		case <-w.done:
			return d, ErrClosed
		}
	}
}

// waitAfter decides what Wait does after denial d by rule r (nil when the
// policy no longer has it) of a request of hits: how long to wait before
// trying again (0: back off), or an error when waiting cannot succeed.
// left is the time to ctx's deadline when bounded; probe caps the wait
// for a failure mode, so that a region that comes back is noticed.
func waitAfter(d Decision, r *policy.Rule, hits int64, left time.Duration, bounded bool, probe time.Duration) (time.Duration, error) {
	if r != nil && !r.Shadow {
		if need := tokens(max(hits, 1), r.Cost); need > min(r.Burst, maxSpend) {
			return 0, fmt.Errorf("%w: rule %q: %d hits × cost %d = %d tokens, burst %d",
				ErrExceedsBurst, r.Name, max(hits, 1), r.Cost, need, r.Burst)
		}
	}
	switch d.Path {
	case PathFallbackLocal, PathFailedClosed:
		// A guess that the region's return can beat: try again by then.
		if d.RetryAfter <= 0 {
			return probe, nil
		}
		return min(d.RetryAfter, probe), nil
	}
	if bounded && d.RetryAfter > 0 && d.RetryAfter > left {
		return 0, fmt.Errorf("%w: rule %q denies for %v, the deadline is in %v: %w",
			ErrWouldExceedDeadline, d.Rule, d.RetryAfter, max(left, 0), context.DeadlineExceeded)
	}
	return d.RetryAfter, nil
}
