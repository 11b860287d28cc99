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
	"syscall"
	"time"

	"github.com/ration-dev/ration/internal/regiond"
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
	fs.StringVar(&cfg.Admin, "admin", "127.0.0.1:7071", "admin HTTP address (/healthz, /readyz, /metrics); - disables it")
	fs.StringVar(&cfg.RedisURL, "redis", "", "Redis URL (redis://host:port/db, rediss://…, or host:port,host:port for a cluster); empty uses the embedded memory store")
	fs.StringVar(&cfg.PolicyFile, "policy", "", "policy YAML file, watched for changes; empty uses the embedded example policy")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 100*time.Millisecond, "lease lifetime τ")
	fs.DurationVar(&cfg.StoreTimeout, "store-timeout", 50*time.Millisecond, "deadline of each store call")
	grace := fs.Duration("grace", 10*time.Second, "how long in-flight calls may take to finish at shutdown")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
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
