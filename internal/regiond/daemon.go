package regiond

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/ration-dev/ration/internal/bearer"
	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/rlqs"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/embedded"
	"github.com/ration-dev/ration/sync/exchange"
)

//go:embed default-policy.yaml
var defaultPolicy []byte

// Daemon is one regiond replica. Start it, then Shutdown it; Shutdown waits
// for every goroutine that Start began.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	store  service.Store
	shares shareStore // the same store, as the exchange writes it
	// keeper is the store as the lease service grants from it and the
	// exchange writes shares through it (nil without an exchange).
	keeper  *service.ShareKeeper
	mem     *lease.MemoryStore // nil with Redis
	redis   *lease.RedisStore  // nil with the memory store
	closeDB func() error
	initial int64 // this region's initial share of a global key
	svc     *service.Service
	pol     *enforcer
	rev     atomic.Uint64   // the policy store's revision applied (policykv.go)
	watcher *policy.Watcher // nil with the embedded policy
	// adminToken guards /metrics; nil without AdminTokenFile.
	adminToken *bearer.Guard

	// The cross-region exchange, when NATS is configured.
	obs     observer
	natsMet *natsMetrics
	nats    *embedded.Server // nil without -nats-embedded
	nc      *nats.Conn
	x       *exchange.Exchanger

	grpc     *grpc.Server
	leaseLis net.Listener
	// Envoy's RLQS, when RLQSListen is set: its own gRPC server.
	rlqs     *rlqs.Server
	rlqsGRPC *grpc.Server
	rlqsLis  net.Listener
	admin    *http.Server
	adminLis net.Listener

	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started time.Time // when Start began: uptime, and the ready grace
	adm     *adminMetrics

	shutdownOnce sync.Once
	shutdownErr  error
}

// New builds a daemon from cfg: it connects the store and loads the policy,
// but binds no socket and starts no goroutine until Start.
func New(cfg Config) (*Daemon, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
		cfg.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if cfg.Replica == "" {
		cfg.Replica = defaultReplica()
	}
	d := &Daemon{cfg: cfg, log: cfg.Logger.With("region", cfg.Region), initial: region.PPM}
	if cfg.exchanging() {
		var err error
		if d.initial, err = initialShare(cfg); err != nil {
			return nil, fmt.Errorf("regiond: exchange: %w", err)
		}
		d.natsMet = newNATSMetrics(cfg.Registry)
		if err := d.natsMet.registerError; err != nil {
			return nil, fmt.Errorf("regiond: metrics: %w", err)
		}
	}

	pm, err := newPolicyMetrics(cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("regiond: metrics: %w", err)
	}
	var pol *policy.Set
	switch {
	case cfg.PolicyFile == "" && cfg.PolicyYAML != nil:
		pol, err = policy.Parse("config:PolicyYAML", cfg.PolicyYAML)
	case cfg.PolicyFile == "":
		pol, err = policy.Parse("embedded:default-policy.yaml", defaultPolicy)
	case cfg.policyBucket() != "":
		// The policy store is on NATS, which Start connects: until its
		// first revision arrives regiond serves no rule and is not ready.
	default:
		d.watcher, err = policy.NewWatcher(policy.WatcherConfig{Path: cfg.PolicyFile, Interval: cfg.PolicyInterval, Logger: d.log,
			OnRefused: func(error) { pm.refused.WithLabelValues("file").Inc() }})
		if err == nil {
			pol = d.watcher.Current()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("regiond: loading policy: %w", err)
	}

	if cfg.RedisURL == "" {
		d.mem = lease.NewMemoryStore(lease.MemoryConfig{})
		d.store, d.shares = d.mem, d.mem
		d.closeDB = func() error { return nil }
	} else {
		var tc *tlsfiles.ClientTLS
		if cfg.RedisCA != "" || cfg.RedisCert != "" {
			if tc, err = tlsfiles.Client(tlsfiles.Files{CA: cfg.RedisCA, Cert: cfg.RedisCert, Key: cfg.RedisKey, Logger: d.log}); err != nil {
				return nil, fmt.Errorf("regiond: redis: %w", err)
			}
		}
		var dial func(ctx context.Context, network, addr string) (net.Conn, error)
		if tc != nil {
			dial = tc.Dial
		}
		client, err := lease.NewRedisClientTLS(cfg.RedisURL, dial)
		if err != nil {
			return nil, fmt.Errorf("regiond: redis: %w", err)
		}
		rs, err := lease.NewRedisStore(client, lease.RedisConfig{Timeout: cfg.StoreTimeout, Layout: cfg.RedisLayout, Groups: cfg.RedisGroups})
		if err != nil {
			client.Close()
			return nil, fmt.Errorf("regiond: redis: %w", err)
		}
		d.store, d.shares, d.redis = rs, rs, rs
		d.closeDB = client.Close
	}

	scfg := service.Config{
		Region:       cfg.Region,
		Store:        d.store,
		Policy:       pol,
		LeaseTTL:     cfg.LeaseTTL,
		StoreTimeout: cfg.StoreTimeout,
		Registerer:   cfg.Registry,
		Logger:       d.log,
	}
	if cfg.exchanging() {
		scfg.ShareRetryAfter = cfg.SyncPeriod
		scfg.Observer = &d.obs
		scfg.InitialShareFor = func(string, *policy.Rule) int64 { return d.initial }
		// The exchange's raises of keys whose bucket has plenty wait
		// until a grant finds them short (lease/service/shares.go), and
		// its first writes of keys without demand here until a grant
		// (deferred.go).
		if d.keeper, err = service.NewShareKeeper(service.ShareKeeperConfig{Store: d.store, Write: d.shares.SetShares}); err != nil {
			d.closeDB()
			return nil, fmt.Errorf("regiond: %w", err)
		}
		scfg.Store = d.keeper
	}
	d.svc, err = service.New(scfg)
	if err != nil {
		d.closeDB()
		return nil, fmt.Errorf("regiond: %w", err)
	}
	if d.adm, err = newAdminMetrics(cfg.Registry, d); err != nil {
		d.closeDB()
		return nil, fmt.Errorf("regiond: metrics: %w", err)
	}
	if cfg.RLQSListen != "" {
		rc := rlqs.Config{Leaser: d.svc, Registerer: cfg.Registry, Logger: d.log}
		if cfg.RLQS != nil {
			cfg.RLQS(&rc)
			rc.Leaser, rc.Registerer, rc.Logger = d.svc, cfg.Registry, d.log
		}
		if d.rlqs, err = rlqs.New(rc); err != nil {
			d.closeDB()
			return nil, fmt.Errorf("regiond: %w", err)
		}
	}
	d.pol = &enforcer{svc: d.svc, log: d.log, met: pm}
	d.pol.setBase(pol, pol.Version())
	if cfg.AdminTokenFile != "" {
		if d.adminToken, err = bearer.New(cfg.AdminTokenFile); err != nil {
			d.closeDB()
			return nil, fmt.Errorf("regiond: admin token: %w", err)
		}
	}
	return d, nil
}

// Service returns the lease service, for in-process wiring.
func (d *Daemon) Service() *service.Service { return d.svc }

// Start binds the listeners and starts serving. The daemon runs until
// Shutdown; ctx only bounds the start.
func (d *Daemon) Start(ctx context.Context) error {
	d.started = time.Now()
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", d.cfg.Listen)
	if err != nil {
		return fmt.Errorf("regiond: lease API: %w", err)
	}
	d.leaseLis = lis
	if d.cfg.Admin != "-" {
		alis, err := lc.Listen(ctx, "tcp", d.cfg.Admin)
		if err != nil {
			lis.Close()
			return fmt.Errorf("regiond: admin: %w", err)
		}
		d.adminLis = alis
	}

	if d.rlqs != nil {
		rlis, err := lc.Listen(ctx, "tcp", d.cfg.RLQSListen)
		if err != nil {
			lis.Close()
			if d.adminLis != nil {
				d.adminLis.Close()
			}
			return fmt.Errorf("regiond: RLQS: %w", err)
		}
		d.rlqsLis = rlis
	}
	closeListeners := func() {
		lis.Close()
		if d.adminLis != nil {
			d.adminLis.Close()
		}
		if d.rlqsLis != nil {
			d.rlqsLis.Close()
		}
	}

	opts := []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.MaxRecvMsgSize(8 << 20),
	}
	if d.cfg.TLSCert != "" {
		tc, err := tlsfiles.Server(tlsfiles.Files{Cert: d.cfg.TLSCert, Key: d.cfg.TLSKey, CA: d.cfg.TLSClientCA, Logger: d.log})
		if err != nil {
			closeListeners()
			return fmt.Errorf("regiond: lease API: %w", err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	} else if !tlsfiles.Loopback(d.cfg.Listen) {
		d.log.Warn("the lease API is plaintext on a non-loopback address (-insecure): anyone who reaches it can lease any quota", "listen", d.cfg.Listen)
	}
	d.grpc = grpc.NewServer(opts...)
	d.svc.Register(d.grpc)
	if d.rlqs != nil {
		// Its own server on its own address, with the lease API's TLS:
		// proxies reach it, agents the lease API.
		d.rlqsGRPC = grpc.NewServer(opts...)
		d.rlqs.Register(d.rlqsGRPC)
	}

	runCtx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	d.goRun("lease-api", func() error {
		if err := d.grpc.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	if d.rlqsGRPC != nil {
		d.goRun("rlqs", func() error {
			if err := d.rlqsGRPC.Serve(d.rlqsLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return err
			}
			return nil
		})
	}
	if d.adminLis != nil {
		d.admin = &http.Server{Handler: d.adminHandler(), ReadHeaderTimeout: 5 * time.Second}
		d.goRun("admin", func() error {
			if err := d.admin.Serve(d.adminLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	if d.watcher != nil {
		d.goRun("policy-watch", func() error { return d.watcher.Run(runCtx) })
		d.goRun("policy-apply", func() error { d.applyPolicy(runCtx); return nil })
	}
	if d.mem != nil {
		d.goRun("sweep", func() error { d.sweep(runCtx); return nil })
	}
	if d.cfg.exchanging() {
		err := d.connectNATS()
		if err == nil && d.cfg.policyBucket() != "" {
			err = d.startPolicyStore(ctx, runCtx)
		}
		if err == nil {
			err = d.startExchange()
		}
		if err != nil {
			_ = d.Shutdown(ctx)
			return err
		}
	}
	d.log.Info("regiond started", "lease_api", d.LeaseAddr(), "rlqs", d.RLQSAddr(), "admin", d.AdminAddr(), "store", d.storeName(), "policy", d.policyName(),
		"regions", d.cfg.Regions, "replica", d.cfg.Replica, "exchange", d.exchangeName())
	return nil
}

func (d *Daemon) goRun(name string, f func() error) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := f(); err != nil {
			d.log.Error("regiond: "+name+" stopped", "err", err)
		}
	}()
}

// applyPolicy hands every new policy from the file watcher to the service.
func (d *Daemon) applyPolicy(ctx context.Context) {
	cur, changed, cancel := d.watcher.Subscribe()
	defer cancel()
	for {
		d.pol.setBase(cur, cur.Version())
		select {
		case <-ctx.Done():
			return
		case <-changed:
			cur = d.watcher.Current()
			d.log.Info("policy applied", "version", cur.Version(), "rules", len(cur.Rules()))
		}
	}
}

func (d *Daemon) sweep(ctx context.Context) {
	t := time.NewTicker(d.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			d.mem.Sweep(now)
		}
	}
}

// Reload re-reads the policy file now (SIGHUP). A file that fails
// validation is logged and the running policy stays.
func (d *Daemon) Reload() error {
	if d.watcher == nil {
		return nil
	}
	return d.watcher.Reload()
}

// LeaseAddr is the lease API's bound address.
func (d *Daemon) LeaseAddr() string {
	if d.leaseLis == nil {
		return ""
	}
	return d.leaseLis.Addr().String()
}

// RLQSAddr is the RLQS server's bound address ("" without RLQSListen).
func (d *Daemon) RLQSAddr() string {
	if d.rlqsLis == nil {
		return ""
	}
	return d.rlqsLis.Addr().String()
}

// AdminAddr is the admin HTTP server's bound address ("" when disabled).
func (d *Daemon) AdminAddr() string {
	if d.adminLis == nil {
		return ""
	}
	return d.adminLis.Addr().String()
}

func (d *Daemon) storeName() string {
	if d.mem != nil {
		return "memory"
	}
	return "redis"
}

func (d *Daemon) exchangeName() string {
	switch {
	case d.cfg.NATSEmbedded:
		return "embedded nats " + d.NATSURL()
	case d.cfg.NATSURL != "":
		return "nats " + d.cfg.NATSURL
	}
	return "none (single region, share 1)"
}

func (d *Daemon) policyName() string {
	switch {
	case d.watcher != nil, d.cfg.policyBucket() != "":
		return d.cfg.PolicyFile
	case d.cfg.PolicyYAML != nil:
		return "in-process"
	}
	return "embedded example"
}

// Ready reports whether the daemon can serve leases: policy loaded, the
// store answering and, with an exchange, every other region heard (or
// Config.ReadyGrace passed since Start).
func (d *Daemon) Ready(ctx context.Context) error {
	if d.svc.Policy() == nil {
		return errors.New("no policy loaded")
	}
	if err := d.pingStore(ctx); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return d.peersReady()
}

func (d *Daemon) pingStore(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(d.cfg.StoreTimeout, 250*time.Millisecond))
	defer cancel()
	return d.store.Ping(ctx)
}

// Shutdown stops accepting calls, lets in-flight calls finish (until ctx is
// done, then cuts them), stops every goroutine and waits for them.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.shutdownOnce.Do(func() { d.shutdownErr = d.shutdown(ctx) })
	return d.shutdownErr
}

// stopGRPC stops g gracefully, cutting what is left when ctx is done.
func stopGRPC(ctx context.Context, g *grpc.Server) {
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		g.Stop()
		<-stopped
	}
}

func (d *Daemon) shutdown(ctx context.Context) error {
	var errs []error
	if d.cancel != nil {
		if d.rlqs != nil {
			// TTL 0 to every proxy first, so they fall back at once; then
			// the streams are ended and the server stops.
			if err := d.rlqs.Shutdown(ctx); err != nil {
				errs = append(errs, err)
			}
			stopGRPC(ctx, d.rlqsGRPC)
		}
		d.svc.Close() // ends policy streams, which a graceful stop would wait for
		stopped := make(chan struct{})
		go func() { d.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			d.grpc.Stop()
			<-stopped
			errs = append(errs, fmt.Errorf("lease API: %w", ctx.Err()))
		}
		if d.admin != nil {
			if err := d.admin.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("admin: %w", err))
			}
		}
		if err := d.stopExchange(ctx); err != nil {
			errs = append(errs, fmt.Errorf("exchange: %w", err))
		}
		d.cancel()
		d.wg.Wait()
	}
	if err := d.closeDB(); err != nil {
		errs = append(errs, fmt.Errorf("store: %w", err))
	}
	return errors.Join(errs...)
}
