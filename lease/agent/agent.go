package agent

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// Agent decides requests locally by spending tokens leased from its region.
// It is safe for concurrent use. Make one with New and stop it with Close.
type Agent struct {
	cfg  Config
	base time.Time // agent time zero: now() is nanoseconds since base
	// monotonic: the clock is the default, so now() reads only the
	// monotonic clock (time.Since), half the cost of time.Now.
	monotonic bool
	client    leasev1.LeaseServiceClient
	conn      *grpc.ClientConn // owned; nil when Config.Conn was given
	id        *leasev1.Agent
	params    rateParams
	margin    time.Duration // added to the p99 round trip to give the refresh lead

	pol       atomic.Pointer[policy.Set]
	ready     chan struct{}
	readyOnce sync.Once

	keys    *keyMap
	scratch sync.Pool // *scratch
	stripes []stripe
	stripeN atomic.Uint32

	agents atomic.Int64 // agents in the region, from the last response
	lead   atomic.Int64 // nanos: p99 round trip + margin
	rtt    rttTracker

	bmu      sync.Mutex
	br       breaker
	down     atomic.Bool              // the breaker is open
	probeKey atomic.Pointer[keyState] // a key that needed the region while it was down

	qmu   sync.Mutex
	queue []*keyState // keys whose balance fell below low water
	wake  chan struct{}

	smu   sync.Mutex
	sched schedule

	ctr     counters
	metrics *metrics

	ctx    context.Context
	cancel context.CancelFunc
	// calls parents every Lease and Return call. Close cancels it only after
	// the refresher has stopped and the unused tokens went back: cancelling
	// a call the region already answered would lose its grant, whose tokens
	// the region has debited (safe, but they would be neither spent nor
	// returned). Each call still has its own deadline.
	calls       context.Context
	callsCancel context.CancelFunc
	wg          sync.WaitGroup
	closed      atomic.Bool
	closeOnce   sync.Once
	closeErr    error
}

// New starts an agent: it connects to the region (lazily, as gRPC does),
// watches the policy and refreshes leases in the background until Close.
// Call WaitPolicy before serving: until the first policy arrives no rule
// matches and every request is allowed.
func New(cfg Config) (*Agent, error) {
	monotonic := cfg.Clock == nil
	if err := cfg.ensureDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := newState(cfg, cfg.Clock())
	a.monotonic = monotonic
	a.stripes = make([]stripe, 2*runtime.GOMAXPROCS(0))
	a.scratch.New = func() any {
		i := int(a.stripeN.Add(1)) % len(a.stripes)
		return &scratch{
			rules:     make([]*policy.Rule, 0, 8),
			res:       make([]ruleResult, 0, 8),
			buf:       make([]byte, 0, 256),
			stripe:    &a.stripes[i],
			stripeIdx: i,
		}
	}
	m, err := newMetrics(cfg.Registerer, a)
	if err != nil {
		return nil, err
	}
	a.metrics = m
	conn := cfg.Conn
	if conn == nil {
		opts := append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
				MinConnectTimeout: time.Second,
			}),
		}, cfg.DialOptions...)
		cc, err := grpc.NewClient(cfg.Target, opts...)
		if err != nil {
			m.unregister()
			return nil, fmt.Errorf("agent: connecting to %q: %w", cfg.Target, err)
		}
		a.conn, conn = cc, cc
	}
	a.client = leasev1.NewLeaseServiceClient(conn)
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.calls, a.callsCancel = context.WithCancel(context.Background())
	a.wg.Add(2)
	go a.refreshLoop()
	go a.watchPolicy()
	return a, nil
}

// newState returns the decision state that New and NewDriver share, before
// either adds its own: no stripes, scratch pool, metrics, connection or
// goroutines yet. cfg must have its defaults and be valid; base is the
// agent's time zero.
func newState(cfg Config, base time.Time) *Agent {
	a := &Agent{
		cfg:    cfg,
		base:   base,
		id:     &leasev1.Agent{Id: cfg.AgentID},
		params: newRateParams(cfg.LeasePeriod),
		margin: cfg.LeasePeriod / 20,
		ready:  make(chan struct{}),
		keys:   newKeyMap(),
		wake:   make(chan struct{}, 1),
		br:     breaker{threshold: cfg.BreakerFailures, probeEvery: int64(cfg.ProbeInterval)},
	}
	a.agents.Store(1)
	a.lead.Store(int64(a.margin))
	return a
}

// now is the agent's time: nanoseconds since New, read from Config.Clock.
// Time.Sub uses the monotonic clock when both times carry it, so a wall
// clock step never extends a lease.
func (a *Agent) now() int64 {
	if a.monotonic {
		return int64(time.Since(a.base))
	}
	return int64(a.cfg.Clock().Sub(a.base))
}

// WaitPolicy blocks until the first policy has arrived from the region, ctx
// is done, or the agent is closed.
func (a *Agent) WaitPolicy(ctx context.Context) error {
	select {
	case <-a.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-a.ctx.Done():
		return ErrClosed
	}
}

// Ready reports without blocking whether the first policy has arrived:
// nil, or an error saying why not (for a readiness probe).
func (a *Agent) Ready() error {
	select {
	case <-a.ready:
		return nil
	default:
	}
	if a.closed.Load() {
		return ErrClosed
	}
	return errors.New("agent: no policy from the region yet")
}

// Policy returns the rule set in force (nil before the first one).
func (a *Agent) Policy() *policy.Set { return a.pol.Load() }

// Close stops every goroutine the agent started and waits for them, returns
// the unused tokens of every key to the region (best effort, bounded by
// CloseTimeout), and closes the connection if the agent opened it. Decisions
// after Close are made as if the region were unreachable. Close returns nil
// the first time, ErrClosed after.
func (a *Agent) Close() error {
	err := ErrClosed
	a.closeOnce.Do(func() {
		a.closed.Store(true)
		a.down.Store(true)
		a.cancel()
		a.wg.Wait()
		a.returnAll()
		a.callsCancel()
		if a.conn != nil {
			a.conn.Close()
		}
		a.metrics.unregister()
		err = nil
	})
	return err
}

// returnAll drains every key and returns the live tokens in batches.
func (a *Agent) returnAll() {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.CloseTimeout)
	defer cancel()
	now := a.now()
	var batch returnBatch
	a.keys.each(func(k *keyState) {
		k.mu.Lock()
		live, dropped := k.drain(now)
		k.dropped += dropped
		k.returned += live
		k.evicted.Store(true)
		k.mu.Unlock()
		a.ctr.dropped.Add(dropped)
		batch.add(k, live)
		if len(batch.items) >= maxBatch {
			a.sendReturns(ctx, &batch)
		}
	})
	a.sendReturns(ctx, &batch)
}

// Wait is Allow for producers that would rather queue than be rejected: it
// blocks until the request is allowed, ctx is done (returning the last
// denial and ctx's error) or the agent is closed (ErrClosed). It waits each
// denial's RetryAfter, and a growing backoff when a denial gives none.
func (a *Agent) Wait(ctx context.Context, ds []policy.Descriptor, hits int64) (Decision, error) {
	backoff := time.Millisecond
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		if a.closed.Load() {
			return Decision{}, ErrClosed
		}
		d := a.Allow(ctx, ds, hits)
		if d.Allowed {
			return d, nil
		}
		wait := d.RetryAfter
		if wait <= 0 {
			wait = backoff
			backoff = min(2*backoff, a.cfg.LeasePeriod)
		}
		if t == nil {
			t = time.NewTimer(wait)
		} else {
			t.Reset(wait)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return d, ctx.Err()
		case <-a.ctx.Done():
			return d, ErrClosed
		}
	}
}
