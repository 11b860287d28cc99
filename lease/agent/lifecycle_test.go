package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	leasev1 "github.com/ration-dev/ration/lease/v1"
)

const poolPolicy = `
rules:
  - name: pool
    key: [tenant]
    limit: 100000
    period: 1h
`

func TestCloseReturnsUnusedTokens(t *testing.T) {
	r := startSemanticServer(t, poolPolicy, nil)
	a := newAgent(t, r, testConfig())
	ctx := context.Background()
	for i := 0; i < 2000; i++ {
		a.Allow(ctx, ds("tenant", "acme"), 1)
	}
	eventually(t, 5*time.Second, "a lease bigger than one request", func() bool {
		a.Allow(ctx, ds("tenant", "acme"), 1)
		return uint64(a.Stats().TokensGranted) > a.Stats().Decisions[PathLease][1]+10
	})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close got %v, want ErrClosed", err)
	}
	s := a.Stats()
	spent := s.Decisions[PathLease][1]
	if s.TokensReturned == 0 {
		t.Fatalf("Close returned nothing: %+v", s)
	}
	if got := int64(spent) + s.TokensReturned + s.TokensDropped; got != s.TokensGranted {
		t.Errorf("spent %d + returned %d + dropped %d = %d, want granted %d", spent, s.TokensReturned, s.TokensDropped, got, s.TokensGranted)
	}
	// The returned tokens are in the region again: its bucket holds all
	// but what the agent spent or dropped (and a few tokens of refill).
	resp, err := r.Service.Lease(ctx, &leasev1.LeaseRequest{
		Agent: &leasev1.Agent{Id: "probe"},
		Items: []*leasev1.LeaseItem{{Rule: "pool", Key: "tenant=acme", Want: 100000}},
	})
	if err != nil {
		t.Fatal(err)
	}
	left := 100000 - int64(spent) - s.TokensDropped
	if got := resp.Grants[0].Granted; got < left || got > left+50 {
		t.Errorf("region holds %d tokens after Close, want %d (+ a little refill)", got, left)
	}
}

// TestShutdownWithAnEndedContext: a Shutdown whose ctx has ended already
// still stops every goroutine (TestMain's goleak checks) and closes the
// connection, drops the tokens it could not return, keeps the accounting
// whole and reports ctx's error. Decisions after it are made as if the
// region were unreachable.
func TestShutdownWithAnEndedContext(t *testing.T) {
	r := startSemanticServer(t, poolPolicy, nil)
	a := newAgent(t, r, testConfig())
	for i := 0; i < 100; i++ {
		a.Allow(context.Background(), ds("tenant", "acme"), 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown with an ended ctx got %v, want context.Canceled", err)
	}
	if err := a.Shutdown(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("second Shutdown got %v, want ErrClosed", err)
	}
	if err := a.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("Close after Shutdown got %v, want ErrClosed", err)
	}
	s := a.Stats()
	spent := int64(s.Decisions[PathLease][1])
	if got := spent + s.TokensReturned + s.TokensDropped; got != s.TokensGranted {
		t.Errorf("spent %d + returned %d + dropped %d = %d, want granted %d", spent, s.TokensReturned, s.TokensDropped, got, s.TokensGranted)
	}
	if d := a.Allow(context.Background(), ds("tenant", "acme"), 1); d.Path != PathFallbackLocal {
		t.Errorf("a decision after Shutdown got path %v, want FALLBACK_LOCAL", d.Path)
	}
	if _, err := a.Wait(context.Background(), ds("tenant", "acme"), 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Wait after Shutdown got %v, want ErrClosed", err)
	}
}
