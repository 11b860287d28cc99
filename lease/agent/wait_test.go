package agent

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ration-dev/ration/policy"
)

func TestWaitAfter(t *testing.T) {
	r := &policy.Rule{Name: "r", Limit: 10, Period: time.Hour, Burst: 5, Cost: 2}
	shadow := &policy.Rule{Name: "s", Limit: 10, Period: time.Hour, Burst: 5, Cost: 2, Shadow: true}
	const probe = 100 * time.Millisecond
	deny := func(p Path, retry time.Duration) Decision { return Decision{Rule: "r", Path: p, RetryAfter: retry} }
	for _, tt := range []struct {
		name    string
		d       Decision
		r       *policy.Rule
		hits    int64
		left    time.Duration
		bounded bool
		want    time.Duration
		err     error // wrapped by the error; nil: none
	}{
		{"waits the retry", deny(PathDenyCache, time.Second), r, 1, 0, false, time.Second, nil},
		{"within the deadline", deny(PathLease, time.Second), r, 1, 2 * time.Second, true, time.Second, nil},
		{"past the deadline", deny(PathDenyCache, 3*time.Second), r, 1, 2 * time.Second, true, 0, ErrWouldExceedDeadline},
		{"past a deadline already gone", deny(PathLease, time.Millisecond), r, 1, -time.Second, true, 0, ErrWouldExceedDeadline},
		{"no retry: back off, even at the deadline", deny(PathLease, 0), r, 1, 0, true, 0, nil},
		{"more than the burst", deny(PathLease, 0), r, 3, 0, false, 0, ErrExceedsBurst},
		{"the whole burst is fine", deny(PathLease, time.Second), r, 2, 0, false, time.Second, nil},
		{"hits below 1 count as 1", deny(PathLease, time.Second), r, 0, 0, false, time.Second, nil},
		{"a shadow rule never fails", deny(PathLease, time.Second), shadow, 30, 0, false, time.Second, nil},
		{"a rule gone from the policy", deny(PathLease, time.Second), nil, 30, 0, false, time.Second, nil},
		{"fallback: a guess, capped by the probe", deny(PathFallbackLocal, time.Hour), r, 1, time.Second, true, probe, nil},
		{"fallback: a short wait is kept", deny(PathFallbackLocal, 10*time.Millisecond), r, 1, time.Millisecond, true, 10 * time.Millisecond, nil},
		{"closed: the probe, never fails fast", deny(PathFailedClosed, probe), r, 1, time.Millisecond, true, probe, nil},
		{"closed without a retry", deny(PathFailedClosed, 0), r, 1, 0, false, probe, nil},
		{"a failure mode still checks the burst", deny(PathFailedClosed, probe), r, 3, 0, false, 0, ErrExceedsBurst},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := waitAfter(tt.d, tt.r, tt.hits, tt.left, tt.bounded, probe)
			switch {
			case tt.err == nil && err != nil:
				t.Fatalf("got error %v, want none", err)
			case tt.err != nil && !errors.Is(err, tt.err):
				t.Fatalf("got error %v, want one wrapping %v", err, tt.err)
			case got != tt.want:
				t.Errorf("got wait %v, want %v", got, tt.want)
			}
			if errors.Is(err, ErrWouldExceedDeadline) && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
			}
		})
	}
}

// scriptedWait runs a waitLoop over scripted decisions in a synctest
// bubble and returns its decision, when it returned (since the start),
// the times of its attempts and its error.
func scriptedWait(t *testing.T, timeout time.Duration, script []Decision, rule *policy.Rule) (d Decision, took time.Duration, at []time.Duration, err error) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		start := time.Now()
		w := waitLoop{
			done: make(chan struct{}), backoff: time.Millisecond, maxBackoff: 4 * time.Millisecond, probe: 100 * time.Millisecond,
			allow: func() (Decision, *policy.Rule, error) {
				at = append(at, time.Since(start))
				d := script[min(len(at), len(script))-1]
				return d, rule, nil
			},
		}
		d, err = w.run(ctx, 1)
		took = time.Since(start)
	})
	return d, took, at, err
}

func TestWaitLoop(t *testing.T) {
	r := &policy.Rule{Name: "r", Limit: 10, Period: time.Hour, Burst: 5, Cost: 1}
	const milli = time.Millisecond
	allowed := Decision{Allowed: true, Rule: "r", Path: PathLease}

	// Each denial's RetryAfter, then a growing backoff when none is given.
	_, took, at, err := scriptedWait(t, time.Second, []Decision{
		{Rule: "r", Path: PathDenyCache, RetryAfter: 30 * milli},
		{Rule: "r", Path: PathLease}, {Rule: "r", Path: PathLease}, {Rule: "r", Path: PathLease}, {Rule: "r", Path: PathLease},
		allowed,
	}, r)
	if want := []time.Duration{0, 30 * milli, 31 * milli, 33 * milli, 37 * milli, 41 * milli}; err != nil || !equalDurations(at, want) {
		t.Errorf("attempts at %v (err %v), want %v: the retry, then 1, 2, 4, 4ms of backoff", at, err, want)
	}
	if took != 41*milli {
		t.Errorf("allowed after %v, want 41ms", took)
	}

	// A denial past the deadline returns at once, with the denial.
	d, took, at, err := scriptedWait(t, 20*milli, []Decision{{Rule: "r", Path: PathDenyCache, RetryAfter: 30 * milli}}, r)
	if !errors.Is(err, ErrWouldExceedDeadline) || !errors.Is(err, context.DeadlineExceeded) || took != 0 || len(at) != 1 || d.RetryAfter != 30*milli {
		t.Errorf("a 30ms denial with 20ms left got %+v, %v after %v and %d attempts, want the denial and ErrWouldExceedDeadline at once", d, err, took, len(at))
	}
	// The same after a first wait that fitted.
	_, took, _, err = scriptedWait(t, 50*milli, []Decision{
		{Rule: "r", Path: PathDenyCache, RetryAfter: 30 * milli},
		{Rule: "r", Path: PathDenyCache, RetryAfter: 30 * milli},
	}, r)
	if !errors.Is(err, ErrWouldExceedDeadline) || took != 30*milli {
		t.Errorf("a second 30ms denial with 20ms left got %v after %v, want ErrWouldExceedDeadline at 30ms", err, took)
	}

	// More than the burst returns at once.
	_, took, _, err = scriptedWait(t, time.Second, []Decision{{Rule: "r", Path: PathLease}}, &policy.Rule{Name: "r", Limit: 10, Period: time.Hour, Burst: 0, Cost: 1})
	if !errors.Is(err, ErrExceedsBurst) || took != 0 || !strings.Contains(err.Error(), `"r"`) {
		t.Errorf("over the burst got %v after %v, want ErrExceedsBurst naming the rule at once", err, took)
	}

	// A failure mode's denial retries every probe interval until ctx ends:
	// the region may come back before the emergency bucket refills.
	_, took, at, err = scriptedWait(t, 250*milli, []Decision{{Rule: "r", Path: PathFallbackLocal, RetryAfter: time.Hour}}, r)
	if want := []time.Duration{0, 100 * milli, 200 * milli}; !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrWouldExceedDeadline) || took != 250*milli || !equalDurations(at, want) {
		t.Errorf("fallback denials got %v after %v, attempts %v; want ctx's error at 250ms, attempts %v", err, took, at, want)
	}
}

func TestWaitLoopStopsAtShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		done := make(chan struct{})
		w := waitLoop{done: done, backoff: time.Millisecond, maxBackoff: time.Millisecond, probe: time.Second,
			allow: func() (Decision, *policy.Rule, error) {
				return Decision{Rule: "r", Path: PathDenyCache, RetryAfter: time.Hour}, nil, nil
			}}
		time.AfterFunc(time.Minute, func() { close(done) })
		start := time.Now()
		if _, err := w.run(context.Background(), 1); !errors.Is(err, ErrClosed) || time.Since(start) != time.Minute {
			t.Errorf("got %v after %v, want ErrClosed at shutdown, 1m", err, time.Since(start))
		}
	})
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

const waitPolicy = `
rules:
  - {name: small, key: [tenant], limit: 10, period: 1h, burst: 5}
  - {name: watch, key: [tenant], limit: 2, period: 1h, shadow: true}
  - {name: big, key: [user], limit: 1000, period: 1h}
  - {name: open, key: [b], limit: 10, period: 1h, on_error: open}
  - {name: closed, key: [c], limit: 10, period: 1h, on_error: closed}
  - {name: local, key: [l], limit: 10, period: 1h}
`

// TestWaitFailsFast checks Wait on a real agent where waiting cannot
// succeed. Each case has a long deadline: a Wait that blocked instead of
// failing fast would return ctx's plain error, which the checks tell apart.
func TestWaitFailsFast(t *testing.T) {
	r := startSemanticServer(t, waitPolicy, nil)
	a := newAgent(t, r, testConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// More hits than the burst: denied by the rule, at once, nothing asked.
	calls := a.Stats().LeaseCalls
	d, err := a.Wait(ctx, ds("tenant", "t1"), 6)
	if !errors.Is(err, ErrExceedsBurst) || d.Allowed || d.Rule != "small" {
		t.Errorf("6 hits on a burst of 5 got %+v, %v; want a denial by small and ErrExceedsBurst", d, err)
	}
	// With another rule that would allow: the exceeded rule decides, and
	// the other rule's key is not even asked for.
	d, err = a.Wait(ctx, ds("tenant", "t1", "user", "u1"), 6)
	if !errors.Is(err, ErrExceedsBurst) || d.Rule != "small" {
		t.Errorf("6 hits on small and big got %+v, %v; want a denial by small and ErrExceedsBurst", d, err)
	}
	if got := a.Stats().LeaseCalls; got != calls {
		t.Errorf("requests over a burst made %d lease calls, want 0", got-calls)
	}

	// A shadow rule's burst exceeded: allowed, described by the shadow rule.
	if d, err := a.Wait(ctx, ds("tenant", "t2"), 3); err != nil || !d.Allowed || d.Path != PathShadow || d.Rule != "watch" {
		t.Errorf("3 hits over the shadow rule's burst of 2 got %+v, %v; want allowed by SHADOW", d, err)
	}

	// A key whose quota is spent for the hour: the denial's wait is past
	// the deadline.
	for range 5 {
		a.Allow(ctx, ds("tenant", "t3"), 1)
	}
	d, err = a.Wait(ctx, ds("tenant", "t3"), 1)
	if !errors.Is(err, ErrWouldExceedDeadline) || !errors.Is(err, context.DeadlineExceeded) || d.Allowed || d.Rule != "small" || d.RetryAfter < 10*time.Second {
		t.Errorf("an hour's quota spent got %+v, %v; want a denial by small for minutes and ErrWouldExceedDeadline", d, err)
	}
	// With another rule that would allow: the denying rule decides, and
	// the other spends nothing (here its key is not even looked at: the
	// deny cache answers first).
	d, err = a.Wait(ctx, ds("tenant", "t3", "user", "u2"), 1)
	if !errors.Is(err, ErrWouldExceedDeadline) || d.Rule != "small" {
		t.Errorf("small spent and big fine got %+v, %v; want a denial by small and ErrWouldExceedDeadline", d, err)
	}
	if k := a.c.keys.get([]byte("big\x00user=u2")); k != nil {
		k.mu.Lock()
		spent := k.spentLocked()
		k.mu.Unlock()
		if spent != 0 {
			t.Errorf("big's key spent %d tokens for a denied request, want 0", spent)
		}
	}
	// Without a deadline the same Wait would block: a context that is
	// cancelled meanwhile ends it with its own error.
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if _, err := a.Wait(cctx, ds("tenant", "t3"), 1); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled Wait without a deadline got %v, want context.Canceled", err)
	}
}

// TestWaitWhileTheRegionIsUnreachable checks Wait on failure-mode
// decisions, with the agent's breaker held open.
func TestWaitWhileTheRegionIsUnreachable(t *testing.T) {
	r := startSemanticServer(t, waitPolicy, nil)
	a := newAgent(t, r, testConfig())
	a.c.bmu.Lock()
	a.c.br.open, a.c.br.failures, a.c.br.nextProbe = true, a.cfg.BreakerFailures, math.MaxInt64
	a.c.down.Store(true)
	a.c.bmu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if d, err := a.Wait(ctx, ds("b", "x"), 1); err != nil || !d.Allowed || d.Path != PathFailedOpen {
		t.Errorf("on_error open got %+v, %v; want allowed, FAILED_OPEN", d, err)
	}
	// Closed and an exhausted emergency bucket never fail fast on the
	// deadline: the region may come back first. A deadline already past
	// shows it without waiting.
	past, pcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer pcancel()
	d, err := a.Wait(past, ds("c", "x"), 1)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrWouldExceedDeadline) || d.Path != PathFailedClosed {
		t.Errorf("on_error closed got %+v, %v; want FAILED_CLOSED and ctx's own error", d, err)
	}
	for a.Allow(ctx, ds("l", "x"), 1).Allowed {
		// Spend the emergency bucket.
	}
	d, err = a.Wait(past, ds("l", "x"), 1)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrWouldExceedDeadline) || d.Path != PathFallbackLocal {
		t.Errorf("an empty emergency bucket got %+v, %v; want FALLBACK_LOCAL and ctx's own error", d, err)
	}
	// Over the burst fails fast whatever decides.
	if _, err := a.Wait(ctx, ds("c", "y"), 11); !errors.Is(err, ErrExceedsBurst) {
		t.Errorf("11 hits on a burst of 10 while unreachable got %v, want ErrExceedsBurst", err)
	}
}
