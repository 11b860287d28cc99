package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func mustPolicy(t testing.TB, doc string) *policy.Set {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// region is a real lease service on a loopback port, over a store, that a
// test can stop and start again on the same address.
type region struct {
	t     testing.TB
	svc   *service.Service
	store service.Store
	addr  string

	mu   sync.Mutex
	g    *grpc.Server
	done chan struct{}
}

// startRegion serves doc from a memory store (when store is nil) with the
// real clock.
func startRegion(t testing.TB, doc string, store service.Store) *region {
	t.Helper()
	return startRegionWith(t, doc, store, service.Config{})
}

// startRegionWith is startRegion with more of the service's configuration.
func startRegionWith(t testing.TB, doc string, store service.Store, cfg service.Config) *region {
	t.Helper()
	if store == nil {
		store = lease.NewMemoryStore(lease.MemoryConfig{})
	}
	cfg.Region, cfg.Store, cfg.Policy, cfg.Logger = "eu", store, mustPolicy(t, doc), quietLogger()
	svc, err := service.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &region{t: t, svc: svc, store: store, addr: "127.0.0.1:0"}
	r.start()
	t.Cleanup(func() {
		svc.Close()
		r.stop()
	})
	return r
}

func (r *region) start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var lis net.Listener
	var err error
	// The port of a stopped server is free at once on loopback, but allow
	// a few tries in case the kernel is slow to release it.
	for try := 0; try < 50; try++ {
		if lis, err = net.Listen("tcp", r.addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		r.t.Fatal(err)
	}
	r.addr = lis.Addr().String()
	r.g = grpc.NewServer()
	r.svc.Register(r.g)
	r.done = make(chan struct{})
	go func(g *grpc.Server, done chan struct{}) {
		defer close(done)
		g.Serve(lis)
	}(r.g, r.done)
}

// stop closes the listener and every connection at once, as a crash would.
func (r *region) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.g == nil {
		return
	}
	r.g.Stop()
	<-r.done
	r.g = nil
}

// newAgent starts an agent against r and waits for its policy.
func newAgent(t testing.TB, r *region, cfg Config) *Agent {
	t.Helper()
	cfg.Target = r.addr
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
