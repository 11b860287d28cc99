// Command regiond is ration's regional daemon: it serves the lease API that
// gateway agents take token batches from, on the region's allocator store.
//
// With no flags it runs on embedded defaults (memory store, example policy)
// on loopback and prints where it listens:
//
//	go run ./cmd/regiond
//
// In production, point it at the region's Redis and a policy file:
//
//	regiond -region eu -listen :7070 -admin :7071 -redis redis://redis:6379/0 -policy /etc/ration/policy.yaml
//
// Several regions share each global quota by exchanging reports over NATS
// once per sync period: give every region's daemons the same -regions and a
// NATS server, cluster or supercluster (-nats), or run one in-process
// (-nats-embedded, for one machine):
//
//	regiond -region eu -regions us,eu,ap -nats nats://nats.eu:4222 -redis redis://redis:6379/0
//
// Without -nats or -nats-embedded a region exchanges nothing and holds the
// whole of every quota (share 1).
//
// Every region can enforce one policy from the policy store, a JetStream
// key-value bucket on the same NATS, which `ration policy push` writes
// (with history, rollback and staged rollout):
//
//	regiond -region eu -regions us,eu,ap -nats nats://nats.eu:4222 -policy nats-kv://ration-policy
//
// Envoy proxies can take quota assignments from the region directly over
// Envoy's Rate Limit Quota Service (-rlqs-listen :7072; docs/RLQS.md).
//
// SIGHUP reloads the policy file; SIGINT or SIGTERM stops accepting calls,
// lets in-flight calls finish and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ration-dev/ration/internal/regiond"
	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "regiond:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("regiond", flag.ContinueOnError)
	var cfg regiond.Config
	fs.StringVar(&cfg.Region, "region", "local", "this region's name")
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:7070", "lease API (gRPC) address")
	fs.StringVar(&cfg.RLQSListen, "rlqs-listen", "", "serve Envoy's Rate Limit Quota Service (RLQS, gRPC) on this address, with the lease API's TLS; empty: none")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "the lease API's server certificate chain (PEM; read again when it changes)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "the lease API's server key (PEM)")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "CA bundle (PEM) that client certificates must chain to: the lease API then requires one (mTLS)")
	fs.StringVar(&cfg.AdminTokenFile, "admin-token-file", "", "file holding a bearer token (at least 16 bytes) that /metrics requires; /healthz and /readyz stay open")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "allow a plaintext lease API on an address that is not loopback")
	fs.StringVar(&cfg.Admin, "admin", "127.0.0.1:7071", "admin HTTP address (/healthz, /readyz, /metrics); - disables it")
	fs.StringVar(&cfg.RedisURL, "redis", "", "Redis URL (redis://host:port/db, rediss://…; host:port,host:port for a cluster; redis-sentinel://[user:pass@]host:26379,host:26379/MASTER?db=0 for Sentinel, rediss-sentinel:// over TLS); empty uses the embedded memory store")
	fs.StringVar(&cfg.RedisCA, "redis-ca", "", "CA bundle (PEM) that verifies Redis's certificate: connect over TLS")
	fs.StringVar(&cfg.RedisCert, "redis-cert", "", "client certificate (PEM) for a Redis with tls-auth-clients")
	fs.StringVar(&cfg.RedisKey, "redis-key", "", "key (PEM) of -redis-cert")
	fs.Func("redis-layout", "where each key's state lives in Redis: keys (its own Redis key, the default) or groups (a field of one of -redis-groups hashes, about half the memory; every replica of a region must agree on -redis-groups)", func(v string) (err error) {
		cfg.RedisLayout, err = lease.ParseRedisLayout(v)
		return err
	})
	fs.IntVar(&cfg.RedisGroups, "redis-groups", 0, "hashes of -redis-layout groups, a power of two: about the active keys / 64 (default 131072)")
	fs.StringVar(&cfg.PolicyFile, "policy", "", "policy YAML file, watched for changes, or nats-kv://BUCKET: the policy store on -nats or -nats-embedded (ration policy push writes it); empty uses the embedded example policy")
	fs.IntVar(&cfg.PolicyReplicas, "policy-replicas", 1, "replicas of the policy store's bucket if regiond creates it (3 on a three-server NATS cluster)")
	fs.StringVar(&cfg.NATSStoreDir, "nats-store-dir", "", "JetStream directory of the embedded NATS server, which keeps the policy store (default: a temporary directory removed at exit)")
	fs.StringVar(&cfg.NATSURL, "nats", "", "NATS URL(s) of the cross-region exchange (nats://host:4222, comma-separated for a cluster); empty with no -nats-embedded: no exchange")
	fs.StringVar(&cfg.NATSCA, "nats-ca", "", "CA bundle (PEM) that verifies the NATS servers: connect over TLS")
	fs.StringVar(&cfg.NATSCert, "nats-cert", "", "client certificate (PEM) for NATS servers that verify clients")
	fs.StringVar(&cfg.NATSKey, "nats-key", "", "key (PEM) of -nats-cert")
	fs.StringVar(&cfg.NATSCreds, "nats-creds", "", "NATS .creds file (user JWT and nkey seed) for a NATS in operator mode")
	fs.StringVar(&cfg.NATSNkey, "nats-nkey", "", "file holding the seed of the NATS nkey user this region connects as")
	fs.BoolVar(&cfg.NATSEmbedded, "nats-embedded", false, "run nats-server in-process on -nats-listen and exchange over it")
	fs.StringVar(&cfg.NATSListen, "nats-listen", "127.0.0.1:4222", "client address of the embedded NATS server")
	regions := fs.String("regions", "", "all regions of the deployment, comma-separated, this one included (default: this region alone)")
	fs.DurationVar(&cfg.SyncPeriod, "sync-period", time.Second, "how often regions exchange reports and move shares (the same in every region)")
	fs.IntVar(&cfg.ReportRefresh, "report-refresh", 0, "how often, in sync periods, the exchange's reports list a key that did not change (they are deltas); -1 sends full reports, for a rolling upgrade from a release before deltas (default 600)")
	fs.DurationVar(&cfg.IdleAfter, "idle-after", 0, "how long a global key must see no demand in any region before the exchange retires it (the same in every region; default 1m)")
	fs.DurationVar(&cfg.DecideAfter, "decide-after", 0, "how long after publishing its tallies a region decides its moves; more than the one-way delay between regions plus clock skew (default sync-period/4)")
	fs.DurationVar(&cfg.ReadyGrace, "ready-grace", 0, "how long after start /readyz waits for a report from every other region before it says ready without them (default 10 sync periods)")
	fs.StringVar(&cfg.Replica, "replica", "", "this replica's name within its region (default: hostname and a random suffix)")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", service.DefaultLeaseTTL, "lease lifetime τ")
	fs.DurationVar(&cfg.StoreTimeout, "store-timeout", service.DefaultStoreTimeout, "deadline of each store call")
	grace := fs.Duration("grace", 10*time.Second, "how long in-flight calls may take to finish at shutdown")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *regions != "" {
		for _, r := range strings.Split(*regions, ",") {
			cfg.Regions = append(cfg.Regions, strings.TrimSpace(r))
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	d, err := regiond.New(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := d.Start(ctx); err != nil {
		return err
	}
	fmt.Printf("regiond %s: lease API on %s, admin on http://%s (/healthz /readyz /metrics)\n",
		cfg.Region, d.LeaseAddr(), d.AdminAddr())
	if a := d.RLQSAddr(); a != "" {
		fmt.Printf("regiond %s: Envoy RLQS on %s\n", cfg.Region, a)
	}
	if u := d.NATSURL(); u != "" {
		fmt.Printf("regiond %s: embedded NATS on %s (-nats %s for the other regions)\n", cfg.Region, u, u)
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			if err := d.Reload(); err != nil {
				cfg.Logger.Error("policy reload failed; the running policy stays", "err", err)
			} else {
				cfg.Logger.Info("policy reloaded")
			}
		case <-ctx.Done():
			stop()
			sctx, cancel := context.WithTimeout(context.Background(), *grace)
			defer cancel()
			cfg.Logger.Info("shutting down")
			return d.Shutdown(sctx)
		}
	}
}
