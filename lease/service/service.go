// Package service serves the lease API (lease/v1) of one region: it validates
// each batch against the policy, runs the allocator on the region's store and
// answers with pre-debited leases. It holds no token state of its own, so any
// number of replicas of a region can serve the same store.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ration-dev/ration/lease"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
)

// Store is the region's allocator as the service uses it: lease.MemoryStore
// and lease.RedisStore both satisfy it.
type Store interface {
	Grant(ctx context.Context, reqs []lease.GrantRequest, out []lease.Grant) error
	Return(ctx context.Context, reqs []lease.ReturnRequest) error
	Ping(ctx context.Context) error
}

// Observer receives the demand and grants of every leased global key, for
// the cross-region exchange. Observe must be cheap and must not block.
type Observer interface {
	Observe(key string, rule *policy.Rule, demand, granted int64)
}

// ErrInvalidConfig is wrapped by New's and Validate's errors for a Config
// that cannot be used.
var ErrInvalidConfig = errors.New("service: invalid config")

// Defaults of Config.
const (
	// DefaultLeaseTTL is τ, the time an agent may spend a lease (LeaseTTL):
	// the lease API's default.
	DefaultLeaseTTL = leasev1.DefaultLeaseTTL
	// DefaultStoreTimeout bounds a store call (StoreTimeout).
	DefaultStoreTimeout = 50 * time.Millisecond
)

// Config configures a Service. The zero value of every optional field means
// its default.
type Config struct {
	// Region is this region's name. Required.
	Region string
	// Store is the region's allocator. Required.
	Store Store
	// Policy is the rule set in force at start; SetPolicy replaces it. Nil
	// means no rules yet: every item is rejected as an unknown rule.
	Policy *policy.Set
	// InitialShare is the share, in ppm, that this region holds of a
	// scope: global key before the exchange has moved any share (default
	// region.PPM: a single region holds the whole quota). scope: region keys
	// always hold region.PPM.
	InitialShare int64
	// InitialShareFor, when set, overrides InitialShare per key (the
	// exchange knows each key's initial split).
	InitialShareFor func(key string, rule *policy.Rule) int64
	// LeaseTTL is τ, how long an agent may spend a lease, measured from when
	// it sent the request (default DefaultLeaseTTL). A fixed window's lease
	// never outlives its window.
	LeaseTTL time.Duration
	// ShareRetryAfter, when an exchange moves the shares of global keys,
	// is the longest retry hint given for one (set it to the sync period):
	// the exchange may raise the key's share at every epoch, and an agent
	// that asks again reports its demand. Zero caps nothing.
	ShareRetryAfter time.Duration
	// DryFor is the longest the service remembers that a key's regional
	// bucket holds no whole token, answering asks for it without the store
	// (default 1s; negative remembers nothing). A global key's memory is
	// also cut at ShareRetryAfter, since the exchange may raise its share
	// at each epoch. See dry.go.
	DryFor time.Duration
	// DryKeys bounds the dry keys remembered (default 1,048,576; negative
	// remembers none): about 120 bytes each.
	DryKeys int
	// NoSpacing stops the memory of dry keys from holding a hot key's asks
	// to the region's grid of instants for it (default false: it holds
	// them, less than a refill step, so that regions emptied together do
	// not keep admitting together; see dryMemory.phaseDelay). With it the
	// memory denies only what the store would.
	NoSpacing bool
	// TopKeys is how many keys per rule the summary of what agents report
	// keeps as candidates for the top keys, per shard and minute (default
	// DefaultTopKeys; negative keeps no summary, and Top and Recent answer
	// nothing). See recent.go for its memory and error.
	TopKeys int
	// StoreTimeout bounds each store call; when it passes the call fails with
	// codes.Unavailable (default DefaultStoreTimeout).
	StoreTimeout time.Duration
	// MaxItems is the largest batch one Lease or Return call may carry
	// (default 1000).
	MaxItems int
	// MaxKeyLen is the longest key accepted, in bytes (default 1024).
	MaxKeyLen int
	// AgentWindow is how recently an agent must have called to be counted
	// among the region's agents (default 10s).
	AgentWindow time.Duration
	// MaxAgents bounds the agents remembered (default 100,000); beyond it the
	// oldest are forgotten, so a flood of identities costs bounded memory.
	MaxAgents int
	// Observer, if set, is told the demand and grants of every global key.
	Observer Observer
	// Registerer receives the service's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock defaults to time.Now. It only dates agents; refills use the
	// store's clock.
	Clock func() time.Time
}

// withDefaults returns c with every zero optional field set to its default.
func (c Config) withDefaults() Config {
	if c.InitialShare == 0 {
		c.InitialShare = region.PPM
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.MaxItems == 0 {
		c.MaxItems = 1000
	}
	if c.MaxKeyLen == 0 {
		c.MaxKeyLen = 1024
	}
	if c.AgentWindow == 0 {
		c.AgentWindow = 10 * time.Second
	}
	if c.MaxAgents == 0 {
		c.MaxAgents = 100_000
	}
	if c.DryFor == 0 {
		c.DryFor = time.Second
	}
	if c.DryKeys == 0 {
		c.DryKeys = 1 << 20
	}
	if c.TopKeys == 0 {
		c.TopKeys = DefaultTopKeys
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	return c
}

// Validate reports whether c, with its defaults filled, is usable by New.
// The error wraps ErrInvalidConfig.
func (c Config) Validate() error { return c.withDefaults().validate() }

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Region == "":
		return bad("Region is required")
	case c.Store == nil:
		return bad("Store is required")
	case c.InitialShare < 0 || c.InitialShare > region.PPM:
		return bad("InitialShare %d outside [0, %d]", c.InitialShare, region.PPM)
	case c.LeaseTTL < 0, c.StoreTimeout < 0, c.AgentWindow < 0, c.ShareRetryAfter < 0:
		return bad("durations must not be negative")
	case c.MaxItems < 0, c.MaxKeyLen < 0, c.MaxAgents < 0:
		return bad("limits must not be negative")
	}
	return nil
}

// Service implements leasev1.LeaseServiceServer. Safe for concurrent use.
type Service struct {
	leasev1.UnimplementedLeaseServiceServer

	cfg      Config
	metrics  *metrics
	agents   *agentSet
	dry      *dryMemory
	recent   *recent // what agents reported lately, for Top (recent.go)
	dryHub   dryHub
	refusals refusals
	// joined, when set (by tests, before any call), is called when an ask
	// waits for another call's answer.
	joined func()
	// Items sent to the store, for StoreItems and Probes.
	grantItems, returnItems, probeItems atomic.Int64

	mu      sync.Mutex
	pol     *policy.Set
	changed chan struct{} // closed and replaced when pol changes
	closed  chan struct{} // closed by Close: ends every watch stream

	bufs sync.Pool // *batch
}

// New returns a Service for cfg, filling its defaults on a copy. The error
// wraps ErrInvalidConfig.
func New(cfg Config) (*Service, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Service{
		cfg:     cfg,
		metrics: m,
		agents:  newAgentSet(cfg.AgentWindow, cfg.MaxAgents),
		pol:     cfg.Policy,
		changed: make(chan struct{}),
		closed:  make(chan struct{}),
		recent:  newRecent(cfg.Clock(), cfg.TopKeys),
	}
	if cfg.DryFor > 0 {
		s.dry = newDryMemory(cfg.DryKeys, cfg.Region, !cfg.NoSpacing)
	}
	s.bufs.New = func() any { return new(batch) }
	return s, nil
}

// Register adds the service to a gRPC server.
func (s *Service) Register(g *grpc.Server) { leasev1.RegisterLeaseServiceServer(g, s) }

// SetPolicy replaces the rule set in force and streams it to every watching
// agent. Leases already granted stay valid until they expire.
func (s *Service) SetPolicy(p *policy.Set) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p == s.pol {
		return
	}
	s.pol = p
	s.dry.clear()
	close(s.changed)
	s.changed = make(chan struct{})
}

// Policy returns the rule set in force (nil before the first one).
func (s *Service) Policy() *policy.Set {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pol
}

func (s *Service) policyAndChange() (*policy.Set, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pol, s.changed
}

// Forget drops what the service remembers of keys' regional buckets (store
// keys, as policy.AppendStoreKey names them): call it after writing their
// shares, which may let a dry bucket grant again at once.
func (s *Service) Forget(keys ...string) {
	for _, k := range keys {
		s.dry.forget(k)
	}
}

// StoreItems returns the items this service sent to the store: grants and
// returns, one store operation each (a lease item answered from the memory
// of dry keys is none).
func (s *Service) StoreItems() (grants, returns int64) {
	return s.grantItems.Load(), s.returnItems.Load()
}

// Probes returns how many of the grant items StoreItems counts probed a
// key remembered dry once the memory was no longer trusted (the store
// operations a dry key costs).
func (s *Service) Probes() int64 { return s.probeItems.Load() }

// Agents returns how many distinct agents called within AgentWindow.
func (s *Service) Agents() int { return s.agents.count(s.cfg.Clock()) }

// Close ends every WatchPolicy stream, so that a graceful stop of the gRPC
// server does not wait for them forever; unary calls are unaffected. The
// service starts no goroutine: its calls run on the gRPC server's. Close
// returns nil.
func (s *Service) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	return nil
}
