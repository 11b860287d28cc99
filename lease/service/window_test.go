package service

import (
	"context"
	"testing"
	"time"

	leasev1 "github.com/ration-dev/ration/lease/v1"
)

const windowPolicy = `
rules:
  - name: minute
    key: [tenant]
    algorithm: fixed_window
    limit: 10
    period: 1m
  - name: slow
    key: [tenant]
    limit: 60
    period: 1h
`

// TestFixedWindowLeases: a fixed window's lease never outlives its window,
// and tokens returned within τ of a window's start are dropped (they may be
// the window before's), later ones credited.
func TestFixedWindowLeases(t *testing.T) {
	f := start(t, Config{Policy: mustPolicy(t, windowPolicy)})
	// 1,700,000,000 s is 22:13:20 UTC: 40 s left in the minute.
	item := func(want int64) *leasev1.LeaseItem {
		return &leasev1.LeaseItem{Rule: "minute", Key: "tenant=acme", Want: want, Demand: want}
	}
	if g := f.lease(t, item(3)).Grants[0]; g.GetGranted() != 3 || g.GetTtl().AsDuration() != DefaultLeaseTTL {
		t.Fatalf("40 s before the window's end: %v, want 3 tokens for τ", g)
	}
	f.clock.Advance(40*time.Second - 30*time.Millisecond)
	if g := f.lease(t, item(3)).Grants[0]; g.GetGranted() != 3 || g.GetTtl().AsDuration() != 30*time.Millisecond {
		t.Fatalf("30 ms before the window's end: %v, want 3 tokens for 30 ms", g)
	}
	ret := func() {
		t.Helper()
		if _, err := f.client.Return(context.Background(), &leasev1.ReturnRequest{Agent: agent("a1"),
			Items: []*leasev1.ReturnItem{{Rule: "minute", Key: "tenant=acme", Tokens: 4}}}); err != nil {
			t.Fatal(err)
		}
	}
	f.clock.Advance(30*time.Millisecond + DefaultLeaseTTL/2) // in the next window, within τ of its start
	if g := f.lease(t, item(6)).Grants[0]; g.GetGranted() != 6 {
		t.Fatalf("a new window: granted %d, want 6 of its 10", g.GetGranted())
	}
	ret()
	if g := f.lease(t, item(20)).Grants[0]; g.GetGranted() != 4 {
		t.Fatalf("after a return within τ of the window's start: granted %d, want the 4 left (the return dropped)", g.GetGranted())
	}
	f.clock.Advance(DefaultLeaseTTL)
	ret()
	if g := f.lease(t, item(20)).Grants[0]; g.GetGranted() != 4 {
		t.Fatalf("after a return τ past the window's start: granted %d, want the 4 returned", g.GetGranted())
	}
}

// TestShareRetryAfter: while an exchange runs, a global key's retry hint is
// at most ShareRetryAfter; without one, the store's.
func TestShareRetryAfter(t *testing.T) {
	for _, c := range []struct {
		cap, want time.Duration
	}{{0, time.Minute}, {time.Second, time.Second}} {
		f := start(t, Config{Policy: mustPolicy(t, windowPolicy), ShareRetryAfter: c.cap})
		item := &leasev1.LeaseItem{Rule: "slow", Key: "tenant=acme", Want: 60, Demand: 60}
		f.lease(t, item) // the bucket's 60 tokens
		if got := f.lease(t, item).Grants[0].GetRetryAfter().AsDuration(); got < c.want-time.Millisecond || got > c.want {
			t.Errorf("cap %v: retry after %v, want %v", c.cap, got, c.want)
		}
	}
}
