package agent

import (
	"context"
	"testing"
	"time"
)

const dryPolicy = `
rules:
  - name: user
    key: [user]
    limit: 2
    period: 1m
    burst: 2
`

// TestDryNoticeDeniesLocally: another agent empties a key's bucket; the
// region's WatchDry notice reaches this agent, which then denies the key
// from its deny cache without a round trip, until the bucket could grant.
func TestDryNoticeDeniesLocally(t *testing.T) {
	r := startLeaseServer(t, dryPolicy, nil)
	cfg := testConfig()
	cfg.RoundTripTimeout = time.Second
	a, b := newAgent(t, r, cfg), newAgent(t, r, cfg)
	ctx := context.Background()
	// Notices reach streams open when the key runs dry (bounded wait).
	deadline := time.Now().Add(10 * time.Second)
	for r.Service.DryWatchers() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the agents' WatchDry streams never opened")
		}
		<-time.After(5 * time.Millisecond) // polling interval
	}
	d := ds("user", "mallory")
	if dec := a.Allow(ctx, d, 1); !dec.Allowed {
		t.Fatalf("a's first request: %+v", dec)
	}
	// b takes what is left, and then is denied: the bucket is dry.
	for i := 0; i < 5 && b.Allow(ctx, d, 1).Allowed; i++ {
	}
	k := a.c.keys.get([]byte("user\x00user=mallory"))
	if k == nil {
		t.Fatal("a does not hold the key")
	}
	deadline = time.Now().Add(10 * time.Second)
	for k.denyUntil.Load() <= a.now() {
		if time.Now().After(deadline) {
			t.Fatal("no dry notice reached a within 10s")
		}
		<-time.After(5 * time.Millisecond) // polling interval
	}
	// a's own leased token, if any is left, is spent first; then the
	// notice denies locally.
	before := a.Stats().SyncDecisions
	for range 3 {
		dec := a.Allow(ctx, d, 1)
		if !dec.Allowed && dec.Path != PathDenyCache {
			t.Fatalf("a denied %+v, want the deny cache's denial", dec)
		}
	}
	if n := a.Stats().SyncDecisions - before; n != 0 {
		t.Errorf("%d of a's decisions waited for a round trip after the notice", n)
	}
}

// TestDriverDry: a Driver's Dry makes a held key deny locally until the
// notice's retry, and ignores keys it does not hold.
func TestDriverDry(t *testing.T) {
	w := newDriverWorld(t, dryPolicy, time.Millisecond)
	d := ds("user", "eve")
	// The key is held once its first request's round trip is done.
	if _, ok := w.d.Decide(w.now, d, 1, 1); !ok {
		w.send(w.d.Poll(w.now))
		w.advance(2 * time.Millisecond)
	}
	w.now = 3 * time.Millisecond
	if w.d.Dry(w.now, "user", "user=nobody", time.Second) {
		t.Error("Dry created a key the Driver does not hold")
	}
	if !w.d.Dry(w.now, "user", "user=eve", time.Second) {
		t.Fatal("Dry did not find the held key")
	}
	before := w.d.Stats().SyncDecisions
	dec, decided := w.d.Decide(w.now, d, 1, 0)
	if !decided || dec.Allowed || dec.Path != PathDenyCache {
		t.Fatalf("after a notice got %+v (decided %v), want a deny-cache denial at once", dec, decided)
	}
	if w.d.Stats().SyncDecisions != before {
		t.Error("a decision after the notice waited for a round trip")
	}
}
