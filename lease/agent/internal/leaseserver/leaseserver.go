// Package leaseserver runs a real lease service (lease/service over the
// in-memory allocator) on a loopback port for the agent's tests and its
// middleware's. A test stages an outage with Crash and Restart, which stop
// and start it on the same address.
package leaseserver

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

// Server is a lease service serving on Addr.
type Server struct {
	Addr    string
	Service *service.Service

	t    testing.TB
	mu   sync.Mutex
	g    *grpc.Server
	done chan struct{}
}

// Start serves the policy doc with cfg (Region, Store, Policy and Logger
// default to "eu", a memory store, doc and a silent logger) until the test
// ends: t.Cleanup stops it and closes the service.
func Start(t testing.TB, doc string, cfg service.Config) *Server {
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
	s := &Server{Addr: "127.0.0.1:0", Service: svc, t: t}
	s.Restart()
	t.Cleanup(func() {
		svc.Close()
		s.Crash()
	})
	return s
}

// Restart serves again on the same address after Crash (nothing when
// serving already).
func (s *Server) Restart() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.g != nil {
		return
	}
	lis := s.listen()
	s.Addr = lis.Addr().String()
	s.g = grpc.NewServer()
	s.Service.Register(s.g)
	s.done = make(chan struct{})
	go func(g *grpc.Server, done chan struct{}) {
		defer close(done)
		g.Serve(lis)
	}(s.g, s.done)
}

// listen listens on Addr. The port of a crashed server is normally free at
// once; the kernel gets a bounded moment in case it is not.
func (s *Server) listen() net.Listener {
	var lis net.Listener
	var err error
	for try := 0; try < 50; try++ {
		if lis, err = net.Listen("tcp", s.Addr); err == nil {
			return lis
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.t.Fatal(err)
	return nil
}

// Crash closes the listener and every connection at once, as a crash would,
// and returns when the server has stopped (nothing when stopped already).
func (s *Server) Crash() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.g == nil {
		return
	}
	s.g.Stop()
	<-s.done
	s.g = nil
}

// Quiet is a logger that discards everything.
func Quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
