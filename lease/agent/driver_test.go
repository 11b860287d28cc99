package agent

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// driverWorld runs one Driver against a real lease service over a memory
// store on a virtual clock, with a fixed round trip, in one goroutine.
type driverWorld struct {
	t     testing.TB
	start time.Time
	now   time.Duration // since start
	rtt   time.Duration
	svc   *service.Service
	d     *Driver
	// calls in flight, answered at due
	flight []pendingCall
	tags   map[uint64]Decision
	at     map[uint64]time.Duration // when each tag was resolved
	tag    uint64                   // the last tag decideAt used
}

type pendingCall struct {
	due  time.Duration
	c    *Call
	resp *leasev1.LeaseResponse
	err  error
}

func newDriverWorld(t testing.TB, yaml string, rtt time.Duration) *driverWorld {
	t.Helper()
	return newDriverWorldAt(t, yaml, rtt, time.Unix(1_700_000_000, 0), service.Config{}, Config{})
}

// newDriverWorldAt is newDriverWorld starting at start, with more of the
// service's and the agent's configuration.
func newDriverWorldAt(t testing.TB, yaml string, rtt time.Duration, start time.Time, cfg service.Config, acfg Config) *driverWorld {
	t.Helper()
	w := &driverWorld{t: t, start: start, rtt: rtt, tags: map[uint64]Decision{}, at: map[uint64]time.Duration{}}
	set, err := policy.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	clock := func() time.Time { return start.Add(w.now) }
	cfg.Region, cfg.Policy, cfg.Clock = "eu", set, clock
	cfg.Store = lease.NewMemoryStore(lease.MemoryConfig{Clock: clock})
	w.svc, err = service.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	acfg.AgentID = "a1"
	w.d, err = NewDriver(acfg, start)
	if err != nil {
		t.Fatal(err)
	}
	w.d.SetPolicy(set)
	return w
}

// send carries calls: the service answers at once (the store acts at the
// send time) and the answer arrives rtt later.
func (w *driverWorld) send(calls []*Call) {
	for _, c := range calls {
		p := pendingCall{due: c.Sent + w.rtt, c: c}
		if c.Lease != nil {
			p.resp, p.err = w.svc.Lease(context.Background(), c.Lease)
		} else {
			_, p.err = w.svc.Return(context.Background(), c.Return)
		}
		if w.rtt > c.Timeout {
			p.due, p.resp, p.err = c.Sent+c.Timeout, nil, ErrCallTimeout
		}
		w.flight = append(w.flight, p)
	}
}

// advance moves to now, delivering due answers in order.
func (w *driverWorld) advance(now time.Duration) {
	for {
		i := -1
		for j, p := range w.flight {
			if p.due <= now && (i < 0 || p.due < w.flight[i].due) {
				i = j
			}
		}
		if i < 0 {
			break
		}
		p := w.flight[i]
		w.flight = append(w.flight[:i], w.flight[i+1:]...)
		w.now = p.due
		w.d.Complete(p.due, p.c, p.resp, p.err)
		w.resolved()
		w.send(w.d.Poll(p.due))
	}
	w.now = now
	w.send(w.d.Poll(now))
	w.resolved()
}

// resolved records the decisions of waiting requests.
func (w *driverWorld) resolved() {
	for _, r := range w.d.Resolved() {
		w.tags[r.Tag], w.at[r.Tag] = r.Decision, r.At
	}
}

var tenant = []policy.Descriptor{{Key: "tenant", Value: "acme"}}

func TestDriverColdKeyWaitsForOneRoundTrip(t *testing.T) {
	w := newDriverWorld(t, "rules:\n  - {name: r, key: [tenant], limit: 1000, burst: 1000}\n", time.Millisecond)
	if _, ok := w.d.Decide(w.now, tenant, 1, 7); ok {
		t.Fatal("a cold key was decided without a round trip")
	}
	w.send(w.d.Poll(w.now))
	w.advance(2 * time.Millisecond)
	got, ok := w.tags[7]
	if !ok {
		t.Fatalf("the waiting request was not resolved after the round trip")
	}
	want := Decision{Allowed: true, Limit: 1000, Period: time.Second, Rule: "r", Path: PathLease}
	if diff := cmp.Diff(want, got, cmpIgnoreQuota); diff != "" {
		t.Errorf("decision (-want +got):\n%s", diff)
	}
	if s := w.d.Stats(); s.SyncDecisions != 1 || s.LeaseCalls != 1 || s.TokensGranted != 1 {
		t.Errorf("got %d sync decisions, %d lease calls, %d tokens, want 1, 1, 1: a cold key's first lease is one request's", s.SyncDecisions, s.LeaseCalls, s.TokensGranted)
	}
}

var cmpIgnoreQuota = cmp.FilterPath(func(p cmp.Path) bool {
	f := p.Last().String()
	return f == ".Remaining" || f == ".Reset"
}, cmp.Ignore())

// TestDriverNeverSpendsMoreThanGranted runs a steady stream of requests
// over a few seconds and checks the agent's accounting against the
// service: every admitted request was paid by a grant, and the admitted
// rate stays within the limit plus one burst.
func TestDriverNeverSpendsMoreThanGranted(t *testing.T) {
	w := newDriverWorld(t, "rules:\n  - {name: r, key: [tenant], limit: 1000, burst: 100}\n", 2*time.Millisecond)
	var tag uint64
	admitted := 0
	const steps = 3000 // 3s at 1ms, 2 requests a step: twice the limit
	for i := 0; i < steps; i++ {
		now := time.Duration(i) * time.Millisecond
		w.advance(now)
		for j := 0; j < 2; j++ {
			tag++
			if d, ok := w.d.Decide(now, tenant, 1, tag); ok && d.Allowed {
				admitted++
			}
		}
		w.send(w.d.Poll(now))
	}
	w.advance(steps * time.Millisecond)
	for _, d := range w.tags {
		if d.Allowed {
			admitted++
		}
	}
	s := w.d.Stats()
	if int64(admitted) > s.TokensGranted {
		t.Errorf("admitted %d, more than the %d tokens granted", admitted, s.TokensGranted)
	}
	if max := 1000*3 + 100; admitted > max {
		t.Errorf("admitted %d in 3s, more than L·W + b = %d", admitted, max)
	}
	if min := 1000 * 3 * 9 / 10; admitted < min {
		t.Errorf("admitted %d in 3s under twice the limit, want at least %d (90%%)", admitted, min)
	}
	if s.LeaseCalls > steps/5 {
		t.Errorf("%d lease calls in %d steps: leases are not batching", s.LeaseCalls, steps)
	}
}

func TestDriverNeedsAgentID(t *testing.T) {
	if _, err := NewDriver(Config{}, time.Unix(0, 0)); err == nil {
		t.Error("NewDriver without AgentID got no error, want ErrInvalidConfig")
	}
}

func TestDriverTick(t *testing.T) {
	for _, tt := range []struct{ period, want time.Duration }{
		{0, 10 * time.Millisecond}, // DefaultLeasePeriod, 50ms, ÷ 5
		{20 * time.Millisecond, 4 * time.Millisecond},
		{2 * time.Millisecond, time.Millisecond}, // never below 1ms
	} {
		d, err := NewDriver(Config{AgentID: "a1", LeasePeriod: tt.period, LeaseTTL: 2 * max(tt.period, DefaultLeasePeriod)}, time.Unix(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Tick(); got != tt.want {
			t.Errorf("lease period %v: Tick got %v, want %v", tt.period, got, tt.want)
		}
	}
}

// BenchmarkDriverDecide measures a decision on a key holding a large lease:
// the path nearly every simulated request takes.
func BenchmarkDriverDecide(b *testing.B) {
	w := newDriverWorld(b, "rules:\n  - {name: r, key: [tenant], limit: 1000000000, burst: 1000000000}\n", time.Millisecond)
	// Warm the key up so that its leases are large.
	for i := 0; i < 2000; i++ {
		now := time.Duration(i) * time.Millisecond
		w.advance(now)
		for j := 0; j < 1000; j++ {
			w.d.Decide(now, tenant, 1, 0)
		}
		w.send(w.d.Poll(now))
	}
	now := 2000 * time.Millisecond
	w.advance(now)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w.d.Decide(now, tenant, 1, 0)
		if i%1000 == 999 {
			b.StopTimer()
			w.send(w.d.Poll(now))
			now += time.Millisecond
			w.advance(now)
			b.StartTimer()
		}
	}
}
