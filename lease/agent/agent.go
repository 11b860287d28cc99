package agent

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ration-dev/ration/internal/tlsfiles"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// Agent decides requests locally by spending tokens leased from its region.
// It is safe for concurrent use. Make one with New and stop it with
// Shutdown or Close.
//
// An Agent is the agent's core (its decisions, shared with the simulator's
// Driver) and a runtime that carries the core's calls over gRPC: a
// refresher goroutine, a policy watcher, and the clock.
type Agent struct {
	base time.Time // agent time zero: now() is nanoseconds since base
	// monotonic: the clock is the default, so now() reads only the
	// monotonic clock (time.Since), half the cost of time.Now.
	monotonic bool
	scratch   sync.Pool            // *scratch
	latency   prometheus.Histogram // nil without a registry

	c core

	cfg     Config
	client  leasev1.LeaseServiceClient
	conn    *grpc.ClientConn // owned; nil when Config.Conn was given
	stripeN atomic.Uint32
	metrics *metrics

	ready     chan struct{} // closed when the first policy arrives
	readyOnce sync.Once
	done      chan struct{} // closed when Shutdown starts
	stop      context.CancelFunc
	// abort cancels the refresher's calls: only when Shutdown's ctx ends
	// before the refresher has stopped, and once the unused tokens went
	// back. Cancelling a call the region already answered would lose its
	// grant, whose tokens the region has debited (safe, but they would be
	// neither spent nor returned).
	abort    context.CancelFunc
	wg       sync.WaitGroup
	shutOnce sync.Once
	shut     atomic.Bool // Shutdown has started
}

// New starts an agent: it connects to the region (lazily, as gRPC does),
// watches the policy and refreshes leases in the background until Shutdown
// or Close. Call WaitPolicy before serving: until the first policy arrives
// no rule matches and every request is allowed.
func New(cfg Config) (*Agent, error) {
	monotonic := cfg.Clock == nil
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, base: cfg.Clock(), monotonic: monotonic, ready: make(chan struct{}), done: make(chan struct{})}
	a.c.init(cfg, 2*runtime.GOMAXPROCS(0))
	a.c.wall.Store(a.base.UnixNano())
	a.scratch.New = a.newScratch
	m, err := newMetrics(cfg.Registerer, a.Stats)
	if err != nil {
		return nil, err
	}
	a.metrics, a.latency = m, m.latency
	a.c.onGrant = m.observeGrant
	conn, err := a.dial()
	if err != nil {
		m.unregister()
		return nil, err
	}
	a.client = leasev1.NewLeaseServiceClient(conn)
	run, stop := context.WithCancel(context.Background())
	calls, abort := context.WithCancel(context.Background())
	a.stop, a.abort = stop, abort
	a.wg.Add(3)
	go a.refreshLoop(run, calls)
	go a.watchPolicy(run)
	go a.watchDry(run)
	return a, nil
}

// dial returns Config.Conn, or a connection to Config.Target that the
// agent owns.
func (a *Agent) dial() (grpc.ClientConnInterface, error) {
	if a.cfg.Conn != nil {
		return a.cfg.Conn, nil
	}
	creds := insecure.NewCredentials()
	if a.cfg.tls() {
		tc, err := tlsfiles.Client(tlsfiles.Files{Cert: a.cfg.TLSCert, Key: a.cfg.TLSKey, CA: a.cfg.RegiondCA, ServerName: a.cfg.RegiondServerName, Logger: a.cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		creds = tc.Credentials()
	} else if !tlsfiles.Loopback(a.cfg.Target) && len(a.cfg.DialOptions) == 0 {
		a.cfg.Logger.Warn("agent: dialling regiond in plain text over a network: set RegiondCA (and TLSCert, TLSKey for mTLS)", "target", a.cfg.Target)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
	}, a.cfg.DialOptions...)
	cc, err := grpc.NewClient(a.cfg.Target, opts...)
	if err != nil {
		return nil, fmt.Errorf("agent: connecting to %q: %w", a.cfg.Target, err)
	}
	a.conn = cc
	return cc, nil
}

// newScratch makes a decision's scratch for the pool, tied to the next
// stripe in turn.
func (a *Agent) newScratch() any {
	i := int(a.stripeN.Add(1)) % a.c.numStripes()
	return &scratch{
		rules:     make([]*policy.Rule, 0, 8),
		res:       make([]ruleResult, 0, 8),
		buf:       make([]byte, 0, 256),
		stripe:    a.c.stripe(i),
		stripeIdx: i,
	}
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

// anchorWall reads the wall clock again for fixed windows: the monotonic
// clock that dates decisions does not follow a wall clock that was set, and
// windows follow the wall clock, as the store's do. An injected Clock is
// the wall clock already.
func (a *Agent) anchorWall() {
	if a.monotonic {
		a.c.wall.Store(time.Now().UnixNano() - a.now())
	}
}

// WaitPolicy blocks until the first policy has arrived from the region, ctx
// is done, or the agent is shut down.
func (a *Agent) WaitPolicy(ctx context.Context) error {
	select {
	case <-a.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-a.done:
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
	if a.shut.Load() {
		return ErrClosed
	}
	return errors.New("agent: no policy from the region yet")
}

// Policy returns the rule set in force (nil before the first one).
func (a *Agent) Policy() *policy.Set { return a.c.policy() }

// Stats returns the agent's counters.
func (a *Agent) Stats() Stats { return a.c.stats() }

// Shutdown stops every goroutine the agent started and waits for them,
// returns the unused tokens of every key to the region, and closes the
// connection if the agent opened it. Decisions after Shutdown starts are
// made as if the region were unreachable. If ctx ends first, the
// refresher's call in flight is abandoned, the tokens not yet returned are
// dropped, and Shutdown returns ctx's error once everything has stopped.
// It returns ErrClosed after the first call of Shutdown or Close.
func (a *Agent) Shutdown(ctx context.Context) error {
	err := ErrClosed
	// A second call waits for the first to finish.
	a.shutOnce.Do(func() { err = a.shutdown(ctx) })
	return err
}

// shutdown is Shutdown's first call.
func (a *Agent) shutdown(ctx context.Context) error {
	a.shut.Store(true)
	a.c.close()
	close(a.done)
	a.stop()
	stopAbort := context.AfterFunc(ctx, a.abort)
	a.wg.Wait()
	var err error
	if !stopAbort() {
		err = ctx.Err() // the refresher's call was abandoned
	}
	if rerr := a.returnAll(ctx); err == nil {
		err = rerr
	}
	a.abort()
	if a.conn != nil {
		a.conn.Close()
	}
	a.metrics.unregister()
	return err
}

// Close is Shutdown bounded by Config.CloseTimeout.
func (a *Agent) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.CloseTimeout)
	defer cancel()
	return a.Shutdown(ctx)
}

// returnAll drains every key and returns the live tokens within ctx. It
// returns ctx's error when a return failed after ctx ended.
func (a *Agent) returnAll(ctx context.Context) error {
	now := a.now()
	b := a.c.drainAll(now)
	var err error
	for call := a.c.returnCall(b, now, a.cfg.CloseTimeout, false); call != nil; call = a.c.returnCall(b, a.now(), a.cfg.CloseTimeout, false) {
		if a.carry(ctx, call) != nil && ctx.Err() != nil {
			err = ctx.Err()
		}
	}
	return err
}
