package agent

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestSlowSettle decides one rule from the outcome of its round trip at a
// fixed instant, as both Allow and the Driver do after their wait.
func TestSlowSettle(t *testing.T) {
	const doc = `
rules:
  - name: local
    key: [tenant]
    limit: 100
    period: 1s
  - name: open
    key: [tenant]
    limit: 100
    period: 1s
    on_error: open
  - name: closed
    key: [tenant]
    limit: 100
    period: 1s
    on_error: closed
`
	const now = 1000 * ms
	type outcome struct {
		Decided, Done, OK bool
		Path              Path
		Retry             time.Duration
	}
	tests := []struct {
		name      string
		rule      string
		lease     int64 // tokens the key holds after the answer
		answered  bool  // the round trip is done
		err       error // and failed
		denyUntil int64
		expired   bool // the request's deadline has passed
		// The key's emergency bucket spent its start at this instant.
		fallbackSpent bool
		want          outcome
	}{
		{name: "granted", rule: "local", lease: 5, answered: true,
			want: outcome{Decided: true, Done: true, OK: true, Path: PathLease}},
		{name: "no answer in time, local", rule: "local", expired: true,
			// The emergency bucket starts with one cost.
			want: outcome{Decided: true, Done: true, OK: true, Path: PathFallbackLocal}},
		{name: "region failed, open", rule: "open", answered: true, err: errors.New("unavailable"),
			want: outcome{Decided: true, Done: true, OK: true, Path: PathFailedOpen}},
		{name: "region failed, closed", rule: "closed", answered: true, err: errors.New("unavailable"),
			want: outcome{Decided: true, Done: true, Path: PathFailedClosed, Retry: 100 * time.Millisecond}},
		{name: "granted too little, deny cache", rule: "local", answered: true, denyUntil: now + 30*ms,
			want: outcome{Decided: true, Done: true, Path: PathLease, Retry: 30 * time.Millisecond}},
		{name: "tokens went to others, deadline ahead", rule: "local", answered: true,
			want: outcome{}},
		{name: "tokens went to others, deadline passed", rule: "local", answered: true, expired: true,
			want: outcome{Decided: true, Done: true, OK: true, Path: PathFallbackLocal}},
		{name: "no answer in time, local, start spent", rule: "local", expired: true, fallbackSpent: true,
			// 100/s shared by one agent, headroom 2: the next token in 5ms.
			want: outcome{Decided: true, Done: true, Path: PathFallbackLocal, Retry: 5*time.Millisecond + 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := NewDriver(Config{AgentID: "a1", ProbeInterval: 100 * time.Millisecond}, time.Unix(0, 0))
			if err != nil {
				t.Fatal(err)
			}
			set := mustPolicy(t, doc)
			d.SetPolicy(set)
			c, s := &d.c, d.newScratch()
			r := set.Rule(tt.rule)
			id := []byte(tt.rule + "\x00tenant=acme")
			k := c.keys.getOrCreate(id, func(id []byte) *keyState { return newKeyState(id, len(tt.rule), 0) })
			if tt.lease > 0 {
				k.slots.install(now, now+100*ms, tt.lease)
			}
			k.denyUntil.Store(tt.denyUntil)
			if tt.fallbackSpent {
				k.rareLocked().fallback = emergency{init: true, active: true, last: now}
			}
			f := &flight{done: make(chan struct{}), err: tt.err}
			if tt.answered {
				close(f.done)
			}
			s.res = append(s.res, ruleResult{rule: r, k: k, need: 1, f: f})

			decided := c.slowSettle(s, now, tt.expired)
			rr := &s.res[0]
			got := outcome{Decided: decided, Done: rr.done, OK: rr.ok, Path: rr.path, Retry: time.Duration(rr.retry)}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("got %+v, want %+v (-want +got):\n%s", got, tt.want, diff)
			}
		})
	}
}

// TestRoundTripForgetsJoined: the tokens of requests that joined a round
// trip are forgotten when it completes, failed or not, so that a later
// grant does not count them as waiting.
func TestRoundTripForgetsJoined(t *testing.T) {
	for _, fail := range []bool{false, true} {
		w := newMemWorld(t)
		d := ds("tenant", "acme")
		if _, ok := w.d.Decide(w.now, d, 1, 0); ok {
			t.Fatal("a new key decided without a round trip")
		}
		calls := w.d.Poll(w.now)
		if _, ok := w.d.Decide(w.now, d, 3, 1); ok {
			t.Fatal("a request decided while its key's round trip is in flight")
		}
		k := w.d.c.keys.get([]byte("bench\x00tenant=acme"))
		if got := k.rare.Load().joined; got != 3 {
			t.Fatalf("joined got %d, want 3", got)
		}
		for _, c := range calls {
			if fail {
				w.d.Complete(w.now, c, nil, errors.New("unavailable"))
			} else {
				w.answer([]*Call{c})
			}
		}
		if got := k.rare.Load().joined; got != 0 {
			t.Errorf("failed %v: joined after the round trip got %d, want 0", fail, got)
		}
	}
}
