// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3) from a region's lease path, so that
// Envoy proxies enforce ration quotas with token buckets of their own.
//
// Each proxy stream is treated like an agent. A quota bucket (the report's
// domain and the bucket id, keys sorted) maps to a rule and key as Envoy's
// RLS adapter maps a descriptor (Resolve). The proxy's usage reports are
// its demand, told to the exchange with the lease calls. Its assignment is
// a token_bucket strategy in whole seconds, and every token it may spend
// without asking (the initial fill, and the refills until the TTL ends) is
// leased from the region's store before the assignment is sent, so the
// assignments stay within the region's share. Keep-alives resend the same
// strategy every KeepAlive, leasing the next refills; DENY_ALL answers
// where the region grants nothing; idle buckets are abandoned; Shutdown
// sends TTL 0 to every bucket. docs/RLQS.md states the bound.
//
// Start: New(Config{Leaser: svc}), Register on a gRPC server, Shutdown
// before stopping that server. Core is one stream's decisions without I/O
// (time and policy as arguments, the lease calls as an outbox), which the
// stream handler and the simulator both drive.
package rlqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/policy/envoydesc"
)

// Leaser is the region's lease path as the server uses it; the lease
// service (*service.Service) is one. Assignments are leased through it, so
// they pass the same validation, clients check, store and exchange tallies
// as agents' leases.
type Leaser interface {
	Lease(ctx context.Context, req *leasev1.LeaseRequest) (*leasev1.LeaseResponse, error)
	Return(ctx context.Context, req *leasev1.ReturnRequest) (*leasev1.ReturnResponse, error)
	Policy() *policy.Set
}

// ErrInvalidConfig is wrapped by New's and Validate's errors.
var ErrInvalidConfig = errors.New("rlqs: invalid config")

// Config configures a Server. Zero values mean the defaults.
type Config struct {
	// Leaser is the region's lease path. Required.
	Leaser Leaser
	// DomainKey is the descriptor key of the report's domain, as in
	// envoyrls.Config (default "domain"; "-" passes no domain).
	DomainKey string
	// TTL is every assignment's time to live (default 2s): whole seconds,
	// at least 1s, since Envoy ignores a TTL's fraction.
	TTL time.Duration
	// Slack is the longest a response may take to reach the proxy
	// (default 500ms): refills are pre-debited that much past the TTL. A
	// response slower than that lets a proxy spend refills not paid for,
	// at most its rate times the excess.
	Slack time.Duration
	// FillInterval is the token buckets' fill_interval (default 1s): whole
	// seconds, at least 1s (Envoy divides by its whole seconds).
	FillInterval time.Duration
	// KeepAlive is how often every bucket's assignment is resent (or
	// replaced), its next refills leased first (default 500ms; at most
	// half the TTL, so that one late keep-alive does not expire it).
	KeepAlive time.Duration
	// Headroom multiplies a bucket's demand rate into its tokens per fill
	// (default 1.1).
	Headroom float64
	// Use is the part of the region's refill that this server's buckets of
	// a key are sized to when they ask for more (default 0.95): the rest
	// lets late keep-alives catch up and larger buckets be saved for.
	Use float64
	// IdleAfter abandons a bucket with no request reported for this long
	// (default 2m).
	IdleAfter time.Duration
	// MaxBuckets bounds a stream's buckets and one report's usages
	// (default 10,000).
	MaxBuckets int
	// MaxEntries bounds a bucket id's pairs (default 32); MaxEntryLen a
	// key's or value's bytes (default 256).
	MaxEntries, MaxEntryLen int
	// MaxRequests bounds one usage's allowed + denied (default 1<<40).
	MaxRequests uint64
	// LeaseTimeout bounds each call to the Leaser (default 1s).
	LeaseTimeout time.Duration
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock defaults to time.Now.
	Clock func() time.Time
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.TTL, 2*time.Second)
	def(&c.Slack, 500*time.Millisecond)
	def(&c.FillInterval, time.Second)
	def(&c.KeepAlive, 500*time.Millisecond)
	def(&c.IdleAfter, 2*time.Minute)
	def(&c.LeaseTimeout, time.Second)
	if c.DomainKey == "" {
		c.DomainKey = envoydesc.DefaultDomainKey
	}
	if c.Headroom == 0 {
		c.Headroom = 1.1
	}
	if c.Use == 0 {
		c.Use = 0.95
	}
	if c.MaxBuckets == 0 {
		c.MaxBuckets = 10_000
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = 32
	}
	if c.MaxEntryLen == 0 {
		c.MaxEntryLen = 256
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = 1 << 40
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	return c
}

// Validate reports whether c, with its defaults, is usable by New.
func (c Config) Validate() error { return c.WithDefaults().validate() }

func (c Config) validate() error {
	if c.Leaser == nil {
		return fmt.Errorf("%w: Leaser is required", ErrInvalidConfig)
	}
	return c.validateCore()
}

// validateCore checks what a Core uses: all but the Leaser.
func (c Config) validateCore() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	whole := func(d time.Duration) bool { return d%time.Second == 0 }
	switch {
	case c.TTL < time.Second || !whole(c.TTL):
		return bad("TTL %v: whole seconds, at least 1s", c.TTL)
	case c.Slack < 0:
		return bad("Slack %v is negative", c.Slack)
	case c.FillInterval < time.Second || !whole(c.FillInterval):
		return bad("FillInterval %v: whole seconds, at least 1s", c.FillInterval)
	case c.KeepAlive <= 0 || 2*c.KeepAlive > c.TTL:
		return bad("KeepAlive %v: above 0 and at most half the TTL %v", c.KeepAlive, c.TTL)
	case c.Headroom < 1:
		return bad("Headroom %v below 1", c.Headroom)
	case c.Use <= 0 || c.Use > 1:
		return bad("Use %v outside (0, 1]", c.Use)
	case c.IdleAfter < 0 || c.LeaseTimeout < 0:
		return bad("durations must not be negative")
	case c.MaxBuckets < 0 || c.MaxEntries < 0 || c.MaxEntryLen < 0:
		return bad("limits must not be negative")
	}
	return nil
}

// Server implements rlqsv3.RateLimitQuotaServiceServer. Safe for
// concurrent use.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	cfg  Config
	met  *metrics
	fair Fair          // demand per store key across streams
	seq  atomic.Uint64 // stream ids: each stream leases as agent rlqs/<id>
	wg   sync.WaitGroup
	mu   sync.Mutex
	done chan struct{} // closed by Shutdown
	shut bool
}

// New returns a Server for cfg, its defaults filled on a copy.
func New(cfg Config) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Server{
		cfg:  cfg,
		met:  m,
		done: make(chan struct{}),
	}, nil
}

// Register adds the server to a gRPC server.
func (s *Server) Register(g *grpc.Server) { rlqsv3.RegisterRateLimitQuotaServiceServer(g, s) }

// enter counts a stream in, unless Shutdown began.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shut {
		return false
	}
	s.wg.Add(1)
	return true
}

// Shutdown sends every stream's buckets a TTL of 0, so that proxies fall
// back to their expired_assignment_behavior at once rather than when their
// TTLs end, ends the streams and waits for their goroutines, until ctx is
// done. New streams are refused. Call it before stopping the gRPC server,
// whose graceful stop would otherwise wait for the streams.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if !s.shut {
		s.shut = true
		close(s.done)
	}
	s.mu.Unlock()
	waited := make(chan struct{})
	go func() { s.wg.Wait(); close(waited) }()
	select {
	case <-waited:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rlqs: shutdown: %w", ctx.Err())
	}
}
