package agent

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestRefreshesAreBatched: many active keys are renewed by the refresher in
// shared Lease calls, not one call per key.
func TestRefreshesAreBatched(t *testing.T) {
	r := startRegion(t, `
rules:
  - name: per-tenant
    key: [tenant]
    limit: 1000000
    period: 1s
`, nil)
	a := newAgent(t, r, testConfig())
	ctx := context.Background()
	const keys = 100
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		for i := 0; i < keys; i++ {
			a.Allow(ctx, ds("tenant", fmt.Sprint("t", i)), 1)
		}
	}
	s := a.Stats()
	perCall := float64(s.LeaseItems) / float64(s.LeaseCalls)
	t.Logf("%d keys: %d lease calls carried %d items (%.1f per call); %d sync decisions of %d", keys, s.LeaseCalls, s.LeaseItems, perCall, s.SyncDecisions, s.Total())
	if perCall < 2 {
		t.Errorf("%.1f keys per lease call, want refreshes batched (at least 2 per call on average)", perCall)
	}
}

// TestColdKeyStampedeJoinsOneRoundTrip: many requests arriving at once on a
// key the agent has never seen wait for shared round trips, not one each.
func TestColdKeyStampedeJoinsOneRoundTrip(t *testing.T) {
	r := startSemanticRegion(t, `
rules:
  - name: per-tenant
    key: [tenant]
    limit: 1000000
    period: 1s
`, nil)
	a := newAgent(t, r, testConfig())
	const n = 64
	var wg sync.WaitGroup
	start := make(chan struct{})
	denied := make(chan Decision, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if d := a.Allow(context.Background(), ds("tenant", "stampede"), 1); !d.Allowed {
				denied <- d
			}
		}()
	}
	close(start)
	wg.Wait()
	close(denied)
	for d := range denied {
		t.Errorf("denied under the limit: %+v", d)
	}
	s := a.Stats()
	t.Logf("%d concurrent first requests: %d lease items", n, s.LeaseItems)
	if s.LeaseItems > n/4 {
		t.Errorf("%d lease items for %d concurrent requests on one key, want them to share round trips", s.LeaseItems, n)
	}
}
