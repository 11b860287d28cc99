package agent

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
)

// quotaWorld runs several Drivers against one lease service over a memory
// store, event by event on a virtual clock (requests, answers, refresher
// ticks), so that hours of a slow quota take milliseconds. The region can
// be made unreachable: calls then fail at their deadline without reaching
// the store.
type quotaWorld struct {
	t      testing.TB
	start  time.Time
	now    time.Duration
	rtt    time.Duration
	svc    *service.Service
	rule   *policy.Rule
	agents []*Driver
	flight []worldCall
	// The region is unreachable from downFrom until downTo.
	downFrom, downTo time.Duration

	res quotaResult
}

type worldCall struct {
	agent int
	pendingCall
}

// quotaResult is what a run admitted and what the agents did for it.
type quotaResult struct {
	asked, admitted int64
	// Requests asked and admitted while the region was unreachable.
	outageAsked, outageAdmitted int64
	byPath                      [numPaths]int64 // admitted, by path
	wants                       []int64         // every lease size asked
	wantsAt                     []time.Duration // when each was asked
	returnsAt                   []time.Duration // when each Return was sent
	admittedAt                  []time.Duration // when each admission was decided
}

func newQuotaWorld(t testing.TB, rule string, agents int, cfg Config) *quotaWorld {
	t.Helper()
	return newQuotaWorldAt(t, rule, agents, cfg, time.Unix(1_700_000_000, 0))
}

// newQuotaWorldAt is newQuotaWorld starting at start, which is also the
// agents' epoch: their refresher ticks fall on whole ticks from it.
func newQuotaWorldAt(t testing.TB, rule string, agents int, cfg Config, start time.Time) *quotaWorld {
	t.Helper()
	w := &quotaWorld{t: t, start: start, rtt: time.Millisecond}
	set := mustPolicy(t, "rules:\n  - "+rule+"\n")
	w.rule = set.Rules()[0]
	clock := func() time.Time { return w.start.Add(w.now) }
	var err error
	w.svc, err = service.New(service.Config{Region: "eu", Store: lease.NewMemoryStore(lease.MemoryConfig{Clock: clock}), Policy: set, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	for i := range agents {
		c := cfg
		c.AgentID = fmt.Sprintf("a%d", i)
		d, err := NewDriver(c, w.start)
		if err != nil {
			t.Fatal(err)
		}
		d.SetPolicy(set)
		w.agents = append(w.agents, d)
	}
	return w
}

// send carries agent i's calls: the service acts at once and the answer
// arrives rtt later; while the region is down every call fails at its
// deadline.
func (w *quotaWorld) send(i int, calls []*Call) {
	for _, c := range calls {
		p := worldCall{agent: i, pendingCall: pendingCall{due: c.Sent + w.rtt, c: c}}
		switch {
		case w.downFrom <= c.Sent && c.Sent < w.downTo:
			p.due, p.err = c.Sent+c.Timeout, ErrCallTimeout
		case c.Lease != nil:
			for _, it := range c.Lease.Items {
				w.res.wants = append(w.res.wants, it.Want)
				w.res.wantsAt = append(w.res.wantsAt, c.Sent)
			}
			p.resp, p.err = w.svc.Lease(context.Background(), c.Lease)
		default:
			w.res.returnsAt = append(w.res.returnsAt, c.Sent)
			_, p.err = w.svc.Return(context.Background(), c.Return)
		}
		w.flight = append(w.flight, p)
	}
}

// next returns the earliest answer due or refresher tick.
func (w *quotaWorld) next() time.Duration {
	t := time.Duration(math.MaxInt64)
	for _, p := range w.flight {
		t = min(t, p.due)
	}
	for _, d := range w.agents {
		t = min(t, d.NextTick())
	}
	return t
}

// advance moves the world to now, delivering answers and running the
// refreshers on the way.
func (w *quotaWorld) advance(now time.Duration) {
	for t := w.next(); t <= now; t = w.next() {
		w.now = t
		keep := w.flight[:0]
		var due []worldCall
		for _, p := range w.flight {
			if p.due <= t {
				due = append(due, p)
			} else {
				keep = append(keep, p)
			}
		}
		w.flight = keep
		for _, p := range due {
			w.agents[p.agent].Complete(t, p.c, p.resp, p.err)
			w.collect(p.agent)
		}
		for i, d := range w.agents {
			w.send(i, d.Poll(t))
		}
	}
	w.now = now
	for i, d := range w.agents {
		w.send(i, d.Poll(now))
	}
}

// request decides one request of one cost on agent i at the world's time.
func (w *quotaWorld) request(i int, ds []policy.Descriptor) {
	w.res.asked++
	if w.down() {
		w.res.outageAsked++
	}
	if dec, ok := w.agents[i].Decide(w.now, ds, 1, 0); ok {
		w.count(dec, w.now)
	}
	w.send(i, w.agents[i].Poll(w.now))
}

func (w *quotaWorld) collect(i int) {
	for _, r := range w.agents[i].Resolved() {
		w.count(r.Decision, r.At)
	}
}

func (w *quotaWorld) down() bool { return w.downFrom <= w.now && w.now < w.downTo }

func (w *quotaWorld) count(d Decision, at time.Duration) {
	if d.Allowed {
		w.res.admittedAt = append(w.res.admittedAt, at)
		if w.down() {
			w.res.outageAdmitted++
		}
		w.res.admitted++
		w.res.byPath[d.Path]++
	}
}

// run offers the requests at the given times (sorted), each on agent
// at(i), and then lets the world run until end.
func (w *quotaWorld) run(times []time.Duration, at func(i int) int, end time.Duration) {
	for i, t := range times {
		w.advance(t)
		w.request(at(i), tenant)
	}
	w.advance(end)
}

// stats sums the agents' counters.
func (w *quotaWorld) stats() (granted, dropped, returned, leaseCalls int64, syncShare float64) {
	var total, synced uint64
	for _, d := range w.agents {
		s := d.Stats()
		granted += s.TokensGranted
		dropped += s.TokensDropped
		returned += s.TokensReturned
		leaseCalls += s.LeaseCalls
		total += s.Total()
		synced += s.SyncDecisions
	}
	if total > 0 {
		syncShare = float64(synced) / float64(total)
	}
	return granted, dropped, returned, leaseCalls, syncShare
}

// idealAdmits is what one ideal token bucket (the rule's rate and burst,
// full at the start) admits of requests of one cost at times.
func idealAdmits(r *policy.Rule, times []time.Duration) int64 {
	tokens, last, n := float64(r.Burst), time.Duration(0), int64(0)
	for _, t := range times {
		tokens = min(float64(r.Burst), tokens+(t-last).Seconds()*r.Rate())
		last = t
		if tokens >= 1 {
			tokens--
			n++
		}
	}
	return n
}

// every returns the times of n requests spaced by gap from first.
func every(first, gap time.Duration, n int) []time.Duration {
	ts := make([]time.Duration, n)
	for i := range ts {
		ts[i] = first + time.Duration(i)*gap
	}
	return ts
}

// bursts returns n bursts of size requests every gap from first, the
// requests of a burst spread apart by within.
func bursts(first, gap, within time.Duration, size, n int) []time.Duration {
	var ts []time.Duration
	for i := range n {
		for j := range size {
			ts = append(ts, first+time.Duration(i)*gap+time.Duration(j)*within)
		}
	}
	return ts
}

func roundRobin(agents int) func(int) int { return func(i int) int { return i % agents } }

// summary is a one-line description of a run for the test log.
func (w *quotaWorld) summary(ideal int64) string {
	granted, dropped, returned, calls, sync := w.stats()
	return fmt.Sprintf("admitted %d of %d asked (ideal %d, %.1f%%), granted %d, dropped %d, returned %d, lease calls %d, sync %.0f%%, lease sizes median %d max %d",
		w.res.admitted, w.res.asked, ideal, 100*float64(w.res.admitted)/float64(max(ideal, 1)),
		granted, dropped, returned, calls, 100*sync, median(w.res.wants), slices.Max(append(w.res.wants, 0)))
}

func median(xs []int64) int64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
