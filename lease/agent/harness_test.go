package agent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ration-dev/ration/lease/agent/internal/regiontest"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func quietLogger() *slog.Logger { return regiontest.Quiet() }

func mustPolicy(t testing.TB, doc string) *policy.Set {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type region = regiontest.Region

// startRegion serves doc from a memory store with the real clock.
func startRegion(t testing.TB, doc string, store service.Store) *region {
	t.Helper()
	return startRegionWith(t, doc, store, service.Config{})
}

// startRegionWith is startRegion with more of the service's configuration.
func startRegionWith(t testing.TB, doc string, store service.Store, cfg service.Config) *region {
	t.Helper()
	cfg.Store = store
	return regiontest.Start(t, doc, cfg)
}

// newAgent starts an agent against r and waits for its policy.
func newAgent(t testing.TB, r *region, cfg Config) *Agent {
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
