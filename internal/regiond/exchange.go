package regiond

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/natsauth"
	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/embedded"
	"github.com/ration-dev/ration/sync/exchange"
)

// shareStore is the region's store as the exchange writes it.
type shareStore interface {
	exchange.Store
	Shares(ctx context.Context, keys []string, out []int64) error
}

// forgetting is the region's store as the exchange writes shares to it:
// through the share keeper, which keeps the raises of keys whose bucket has
// plenty (service.ShareKeeper), and the lease service forgets what it
// remembers of a key's bucket once its share is written (or the write may
// have landed), since a raised share or tokens given with it may let a dry
// bucket grant at once.
type forgetting struct {
	shareStore
	svc    *service.Service
	keeper *service.ShareKeeper
	// siblings reports whether agents may lease through another replica
	// of the region, unseen by the keeper, which then keeps no raise.
	siblings func() bool
	log      *slog.Logger
}

func (f forgetting) SetShares(ctx context.Context, ups []lease.ShareUpdate, out []lease.ShareResult) error {
	err := f.keeper.SetShares(ctx, f.shareStore.SetShares, ups, out)
	for i := range ups {
		f.svc.Forget(ups[i].Key)
	}
	return err
}

func (f forgetting) DeleteShares(ctx context.Context, keys []string) error {
	if err := f.keeper.Retiring(ctx, keys); err != nil {
		return err
	}
	err := f.shareStore.DeleteShares(ctx, keys)
	f.svc.Forget(keys...)
	f.keeper.Forget(keys...)
	return err
}

// Incarnation reads the store's incarnation. The keeper knows the shares in
// the store from its own writes; a new incarnation may have lost them, so it
// forgets them. The exchange reads it before each epoch's writes, while it
// holds the region: the raises kept for keys that ran short are written
// then, and all of them once a sibling replica is heard.
func (f forgetting) Incarnation(ctx context.Context) (string, error) {
	inc, err := f.shareStore.Incarnation(ctx)
	if err != nil {
		return inc, err
	}
	f.keeper.KeepRaises(!f.siblings())
	f.keeper.SawIncarnation(inc)
	if ferr := f.keeper.Flush(ctx, f.shareStore.SetShares); ferr != nil {
		// The raises stay kept for the next epoch; the incarnation read
		// stands (the Node must see a store that lost writes).
		f.log.Warn("regiond: writing kept share raises", "err", ferr)
	}
	return inc, nil
}

// siblingsHeard reports whether the exchange hears another replica of this
// region (or has not started: it cannot tell).
func (d *Daemon) siblingsHeard() bool {
	x := d.obs.x.Load()
	return x == nil || x.SiblingsHeard()
}

// resetting is the exchange's election: once this replica takes the hold
// (it was free, or lapsed), another replica may have written shares since
// the keeper last did, so it forgets what it knew of them.
type resetting struct {
	exchange.Coordinator
	keeper *service.ShareKeeper
}

func (r resetting) Acquire(ctx context.Context, reg, holder string, ttl time.Duration) (region.Hold, error) {
	h, err := r.Coordinator.Acquire(ctx, reg, holder, ttl)
	if err != nil || h != region.HoldRenewed {
		r.keeper.Reset()
	}
	return h, err
}

// observer forwards the lease service's tallies to the exchange once it
// runs; before (and without) it they are dropped.
type observer struct {
	x atomic.Pointer[exchange.Exchanger]
}

func (o *observer) Observe(key string, rule *policy.Rule, demand, granted int64) {
	if x := o.x.Load(); x != nil {
		x.Observe(key, rule, demand, granted)
	}
}

// natsMetrics count what the NATS client's handlers see.
type natsMetrics struct {
	connected     prometheus.Gauge
	disconnects   prometheus.Counter
	reconnects    prometheus.Counter
	asyncErrors   prometheus.Counter
	registerError error
}

func newNATSMetrics(reg prometheus.Registerer) *natsMetrics {
	m := &natsMetrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_nats_connected",
			Help: "1 while the exchange's NATS connection is up.",
		}),
		disconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_nats_disconnects_total",
			Help: "Times the exchange's NATS connection went down.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_nats_reconnects_total",
			Help: "Times the exchange's NATS connection came back.",
		}),
		asyncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_nats_async_errors_total",
			Help: "Asynchronous NATS errors (slow consumer, permission violations).",
		}),
	}
	for _, c := range []prometheus.Collector{m.connected, m.disconnects, m.reconnects, m.asyncErrors} {
		if err := reg.Register(c); err != nil {
			m.registerError = err
		}
	}
	return m
}

// initialShare is the region's initial share of every global key, as the
// exchange will compute it; New also validates the exchange's region
// config with it.
func initialShare(cfg Config) (int64, error) {
	rc := region.Config{Self: cfg.Region, Regions: cfg.Regions, Period: cfg.SyncPeriod, Refresh: cfg.ReportRefresh, IdleAfter: cfg.IdleAfter}
	if cfg.ExchangeTune != nil {
		cfg.ExchangeTune(&rc)
	}
	st, err := region.New(rc)
	if err != nil {
		return 0, err
	}
	return st.Initial(cfg.Region), nil
}

func defaultReplica() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "regiond"
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}

// natsAuth returns the NATS options of cfg's TLS files and credentials.
func natsAuth(cfg *Config) ([]nats.Option, error) {
	return natsauth.Options(natsauth.Files{CA: cfg.NATSCA, Cert: cfg.NATSCert, Key: cfg.NATSKey,
		Creds: cfg.NATSCreds, Nkey: cfg.NATSNkey, Logger: cfg.Logger})
}

// connectNATS starts the embedded NATS server (with JetStream, for the
// policy store) if asked, and connects. On error the caller stops what it
// started (stopExchange).
func (d *Daemon) connectNATS() (err error) {
	cfg := &d.cfg
	url := cfg.NATSURL
	if cfg.NATSEmbedded {
		d.nats, err = embedded.Start(embedded.Config{Listen: cfg.NATSListen, JetStream: true, StoreDir: cfg.NATSStoreDir})
		if err != nil {
			return fmt.Errorf("regiond: %w", err)
		}
		url = d.nats.ClientURL()
	}
	log := d.log
	m := d.natsMet
	auth, err := natsAuth(cfg)
	if err != nil {
		return fmt.Errorf("regiond: nats: %w", err)
	}
	d.nc, err = nats.Connect(url, append(auth,
		nats.Name("regiond "+cfg.Region+"/"+cfg.Replica),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(cfg.NATSReconnectWait),
		nats.RetryOnFailedConnect(true), // serve leases while NATS is away
		nats.ConnectHandler(func(*nats.Conn) { m.connected.Set(1); log.Info("nats connected", "url", url) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			m.connected.Set(0)
			m.disconnects.Inc()
			log.Warn("nats disconnected; shares stay as they are until it is back", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			m.connected.Set(1)
			m.reconnects.Inc()
			log.Info("nats reconnected", "url", nc.ConnectedUrl())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			m.asyncErrors.Inc()
			log.Warn("nats error", "err", err)
		}),
	)...)
	if err != nil {
		return fmt.Errorf("regiond: nats %s: %w", url, err)
	}
	if d.nc.IsConnected() {
		m.connected.Set(1)
	}
	return nil
}

// startExchange starts the exchange on the NATS connection. On error the
// caller stops what it started (stopExchange).
func (d *Daemon) startExchange() error {
	cfg := &d.cfg
	var coord exchange.Coordinator = exchange.NewMemoryCoordinator(nil) // one process, one replica
	if d.redis != nil {
		coord = exchange.NewRedisCoordinator(d.redis)
	}
	x, err := exchange.New(exchange.Config{
		Region:      cfg.Region,
		Replica:     cfg.Replica,
		Regions:     cfg.Regions,
		Period:      cfg.SyncPeriod,
		DecideAfter: cfg.DecideAfter,
		Refresh:     cfg.ReportRefresh,
		IdleAfter:   cfg.IdleAfter,
		Conn:        d.nc,
		Store:       forgetting{d.shares, d.svc, d.keeper, d.siblingsHeard, d.log},
		Coordinator: resetting{coord, d.keeper},
		Policy:      d.pol.Base, // what this region loaded; the service enforces it made stricter
		PolicyName:  d.pol.Name,
		OnDisagree:  d.pol.disagree,
		Tune:        cfg.ExchangeTune,
		Registerer:  cfg.Registry,
		Logger:      d.log,
	})
	if err != nil {
		return fmt.Errorf("regiond: exchange: %w", err)
	}
	if err := x.Start(); err != nil {
		return fmt.Errorf("regiond: exchange: %w", err)
	}
	d.x = x
	d.obs.x.Store(x)
	return nil
}

// stopExchange closes the exchange (giving its lease up), the NATS
// connection and the embedded server, in that order.
func (d *Daemon) stopExchange(ctx context.Context) error {
	var errs []error
	d.obs.x.Store(nil)
	if d.x != nil {
		if err := d.x.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
		d.x = nil
	}
	if d.nc != nil {
		d.nc.Close()
		d.nc = nil
	}
	if d.nats != nil {
		d.nats.Close()
		d.nats = nil
	}
	return errors.Join(errs...)
}

// NATSURL is the embedded NATS server's client URL ("" without one): the
// URL other regions' daemons connect to.
func (d *Daemon) NATSURL() string {
	if d.nats == nil {
		return ""
	}
	return d.nats.ClientURL()
}

// Exchanger is the running cross-region exchange (nil without NATS).
func (d *Daemon) Exchanger() *exchange.Exchanger { return d.x }

// Share returns this region's applied share of a global key in ppm, as the
// store holds it: the region's initial share until the exchange wrote one.
// key is policy.StoreKey(rule, descriptor key).
func (d *Daemon) Share(ctx context.Context, key string) (int64, error) {
	out := []int64{0}
	if err := d.shares.Shares(ctx, []string{key}, out); err != nil {
		return 0, err
	}
	if out[0] < 0 {
		return d.initial, nil
	}
	return out[0], nil
}
