package agent

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/policy"
)

// TestRefreshesAreBatched: many active keys are renewed by the refresher in
// shared Lease calls, not one call per key.
func TestRefreshesAreBatched(t *testing.T) {
	if raceEnabled {
		// Round trips under the race detector outlast the leases, so every
		// decision is a cold one and nothing is left to refresh. make test
		// runs this test again without -race (PERFTESTS).
		t.Skip("timing-dependent: judged only without -race")
	}
	r := startLeaseServer(t, `
rules:
  - name: per-tenant
    key: [tenant]
    limit: 1000000
    period: 1s
`, nil)
	a := newAgent(t, r, testConfig())
	ctx := context.Background()
	const keys = 100
	descs := make([][]policy.Descriptor, keys)
	for i := range descs {
		descs[i] = ds("tenant", fmt.Sprint("t", i))
	}
	// Until the refresher has made enough calls to judge (bounded).
	deadline := time.Now().Add(20 * time.Second)
	for a.Stats().RefreshCalls < 20 && time.Now().Before(deadline) {
		for _, d := range descs {
			a.Allow(ctx, d, 1)
		}
	}
	s := a.Stats()
	perCall := float64(s.RefreshItems) / float64(max(s.RefreshCalls, 1))
	t.Logf("%d keys: %d refresh calls carried %d items (%.1f per call); all lease calls %d, items %d; %d sync decisions of %d",
		keys, s.RefreshCalls, s.RefreshItems, perCall, s.LeaseCalls, s.LeaseItems, s.SyncDecisions, s.Total())
	if perCall < 2 {
		t.Errorf("%.1f keys per refresh call, want refreshes batched (at least 2 per call on average)", perCall)
	}
}

// TestColdKeyStampedeJoinsOneRoundTrip: many requests arriving at once on a
// key the agent has never seen wait for shared round trips, not one each.
func TestColdKeyStampedeJoinsOneRoundTrip(t *testing.T) {
	r := startSemanticServer(t, `
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
