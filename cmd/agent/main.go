// Command agent is ration's gateway agent as a sidecar: it serves Envoy's
// rate limit service API (envoy.service.ratelimit.v3.RateLimitService), so
// Envoy, Istio and other Envoy-based gateways decide requests from tokens
// leased from their region's regiond, with no code.
//
//	agent -regiond 127.0.0.1:7070 -listen 127.0.0.1:8081 -admin 127.0.0.1:8082
//
// Point Envoy's rate limit filter at -listen (a gRPC cluster) with
// failure_mode_deny: true and status_on_error: 503, so that rules with
// on_error: closed answer 503 when the region cannot be reached. Rules
// converted from an Envoy ratelimit configuration (ration policy
// import-envoy) need the default -domain-key and -keys-key.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ration-dev/ration/internal/bearer"
	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/lease/agent/envoyrls"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout *os.File) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	regiond := fs.String("regiond", "127.0.0.1:7070", "the region's lease API address")
	regiondCA := fs.String("regiond-ca", "", "CA bundle (PEM) that verifies regiond's certificate: dial regiond over TLS (default roots: the system's, with -tls-cert or -regiond-server-name)")
	tlsCert := fs.String("tls-cert", "", "client certificate (PEM) presented to regiond (mTLS); read again when it changes")
	tlsKey := fs.String("tls-key", "", "key (PEM) of -tls-cert")
	serverName := fs.String("regiond-server-name", "", "name regiond's certificate must carry (default: the host of -regiond)")
	listen := fs.String("listen", "127.0.0.1:8081", "Envoy rate limit service (gRPC) address")
	listenCert := fs.String("listen-tls-cert", "", "serve the Envoy rate limit service over TLS with this certificate (PEM)")
	listenKey := fs.String("listen-tls-key", "", "key (PEM) of -listen-tls-cert")
	listenCA := fs.String("listen-client-ca", "", "CA bundle (PEM) that Envoy's client certificate must chain to (mTLS on -listen)")
	admin := fs.String("admin", "127.0.0.1:8082", "admin HTTP address (/healthz, /readyz, /metrics); - disables it")
	adminToken := fs.String("admin-token-file", "", "file holding a bearer token (at least 16 bytes) that /metrics requires; /healthz and /readyz stay open")
	domainKey := fs.String("domain-key", "domain", "descriptor key that carries Envoy's domain; - passes none")
	keysKey := fs.String("keys-key", "envoy.keys", "descriptor key that carries an Envoy descriptor's entry keys, in order (what rules from ration policy import-envoy match); - passes none")
	limitKey := fs.String("limit-key", "envoy.limit", "descriptor key that carries a descriptor's limit override (\"100/minute\") when a rule with allow_descriptor_limit matches it; - ignores every override")
	headers := fs.Bool("response-headers", true, "add the tightest decision's RateLimit-Policy, RateLimit and X-RateLimit-* fields (and Retry-After when denied) to response_headers_to_add")
	leasePeriod := fs.Duration("lease-period", agent.DefaultLeasePeriod, "T_lease: leases cover this much of a key's recent spend")
	rtTimeout := fs.Duration("round-trip-timeout", 5*time.Millisecond, "deadline of the synchronous round trip for a key with no lease yet; past it the rule's on_error decides")
	grace := fs.Duration("grace", 5*time.Second, "how long in-flight calls may take to finish at shutdown")
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
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var serverOpts []grpc.ServerOption
	switch {
	case *listenCert != "" || *listenKey != "":
		tc, err := tlsfiles.Server(tlsfiles.Files{Cert: *listenCert, Key: *listenKey, CA: *listenCA, Logger: log})
		if err != nil {
			return fmt.Errorf("-listen-tls-cert: %w", err)
		}
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(tc)))
	case *listenCA != "":
		return errors.New("-listen-client-ca needs -listen-tls-cert and -listen-tls-key")
	}
	a, err := agent.New(agent.Config{
		Target: *regiond, RegiondCA: *regiondCA, TLSCert: *tlsCert, TLSKey: *tlsKey, RegiondServerName: *serverName,
		LeasePeriod: *leasePeriod, RoundTripTimeout: *rtTimeout, Registerer: reg, Logger: log,
	})
	if err != nil {
		return err
	}
	defer a.Close()
	rls, err := envoyrls.New(a, envoyrls.Config{DomainKey: *domainKey, KeysKey: *keysKey, LimitKey: *limitKey,
		OmitHeaders: !*headers, Registerer: reg})
	if err != nil {
		return err
	}

	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", *listen)
	if err != nil {
		return err
	}
	if len(serverOpts) == 0 && !tlsfiles.Loopback(lis.Addr().String()) {
		log.Warn("the Envoy rate limit service is plaintext on a non-loopback address: give -listen-tls-cert and -listen-tls-key (and -listen-client-ca), or listen on loopback beside Envoy", "listen", lis.Addr().String())
	}
	g := grpc.NewServer(serverOpts...)
	rls.Register(g)
	serveErr := make(chan error, 2)
	go func() { serveErr <- g.Serve(lis) }()

	var hs *http.Server
	adminAddr := "-"
	if *admin != "-" {
		alis, err := lc.Listen(ctx, "tcp", *admin)
		if err != nil {
			g.Stop()
			return err
		}
		adminAddr = alis.Addr().String()
		mux := http.NewServeMux()
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
			if err := a.Ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ready")
		})
		var guard *bearer.Guard
		if *adminToken != "" {
			if guard, err = bearer.New(*adminToken); err != nil {
				g.Stop()
				alis.Close()
				return fmt.Errorf("-admin-token-file: %w", err)
			}
		}
		mux.Handle("GET /metrics", guard.Wrap(promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})))
		hs = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := hs.Serve(alis); !errors.Is(err, http.ErrServerClosed) {
				serveErr <- err
			}
		}()
	}
	fmt.Fprintf(stdout, "agent: Envoy rate limit service on %s, admin on http://%s, region at %s\n", lis.Addr(), adminAddr, *regiond)

	sig, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	select {
	case <-sig.Done():
	case err := <-serveErr:
		log.Error("server stopped", "err", err)
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), *grace)
	defer cancel()
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-sctx.Done():
		g.Stop()
		<-stopped
	}
	if hs != nil {
		hs.Shutdown(sctx)
	}
	// Close returns the unused leased tokens to the region. Tokens it could
	// not return in time expire within a lease TTL: worth a warning, not a
	// failed exit.
	if err := a.Close(); err != nil && !errors.Is(err, agent.ErrClosed) {
		log.Warn("returning unused tokens", "err", err)
	}
	return nil
}
