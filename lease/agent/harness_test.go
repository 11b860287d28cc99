package agent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ration-dev/ration/lease/agent/internal/leaseserver"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func quietLogger() *slog.Logger { return leaseserver.Quiet() }

func mustPolicy(t testing.TB, doc string) *policy.Set {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startLeaseServer serves doc from store (a memory store when nil) with the
// real clock.
func startLeaseServer(t testing.TB, doc string, store service.Store) *leaseserver.Server {
	t.Helper()
	return startLeaseServerWith(t, doc, store, service.Config{})
}

// startLeaseServerWith is startLeaseServer with more of the service's configuration.
func startLeaseServerWith(t testing.TB, doc string, store service.Store, cfg service.Config) *leaseserver.Server {
	t.Helper()
	cfg.Store = store
	return leaseserver.Start(t, doc, cfg)
}

// newAgent starts an agent against r and waits for its policy.
func newAgent(t testing.TB, r *leaseserver.Server, cfg Config) *Agent {
	t.Helper()
	cfg.Target = r.Addr
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.WaitPolicy(ctx); err != nil {
		t.Fatalf("WaitPolicy: %v", err)
	}
	return a
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(time.Millisecond)
	}
}

func ds(kv ...string) []policy.Descriptor {
	out := make([]policy.Descriptor, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, policy.Descriptor{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

const ms = int64(time.Millisecond)
