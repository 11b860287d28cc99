// Package regiontest runs a real lease service (lease/service over the
// in-memory allocator) on a loopback port for the agent's tests and its
// middleware's, and can stop and restart it on the same address to stage an
// outage.
package regiontest

import (
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
)

// Region is a lease service serving on Addr.
type Region struct {
	Addr    string
	Service *service.Service

	t    testing.TB
	mu   sync.Mutex
	g    *grpc.Server
	done chan struct{}
}

// Start serves the policy doc with cfg (Region, Store, Policy and Logger
// default to "eu", a memory store, doc and a silent logger) until the test
// ends.
func Start(t testing.TB, doc string, cfg service.Config) *Region {
	t.Helper()
	pol, err := policy.Parse("test.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Region == "" {
		cfg.Region = "eu"
	}
	if cfg.Store == nil {
		cfg.Store = lease.NewMemoryStore(lease.MemoryConfig{})
	}
	if cfg.Logger == nil {
		cfg.Logger = Quiet()
	}
	cfg.Policy = pol
	svc, err := service.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &Region{Addr: "127.0.0.1:0", Service: svc, t: t}
	r.Start()
	t.Cleanup(func() {
		svc.Close()
		r.Stop()
	})
	return r
}

// Start serves again on the same address after Stop.
func (r *Region) Start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.g != nil {
		return
	}
	var lis net.Listener
	var err error
	// The port of a stopped server is normally free at once; allow the
	// kernel a bounded moment in case it is not.
	for try := 0; try < 50; try++ {
		if lis, err = net.Listen("tcp", r.Addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		r.t.Fatal(err)
	}
	r.Addr = lis.Addr().String()
	r.g = grpc.NewServer()
	r.Service.Register(r.g)
	r.done = make(chan struct{})
	go func(g *grpc.Server, done chan struct{}) {
		defer close(done)
		g.Serve(lis)
	}(r.g, r.done)
}

// Stop closes the listener and every connection at once, as a crash would.
func (r *Region) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.g == nil {
		return
	}
	r.g.Stop()
	<-r.done
	r.g = nil
}

// Quiet is a logger that discards everything.
func Quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
