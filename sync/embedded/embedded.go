// Package embedded runs the real nats-server in-process, as a library: the
// embedded default of a one-machine deployment (regiond -nats-embedded, the
// local three-region demo) and of tests. Production points regiond at an
// external NATS server, cluster or supercluster instead; nothing else
// changes.
package embedded

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config configures a Server. The zero value listens on a random loopback
// port.
type Config struct {
	// Listen is the client address, host:port (default "127.0.0.1:0";
	// port 0 picks a free port, see Server.ClientURL).
	Listen string
	// MaxPayload is the largest message the server accepts, in bytes
	// (default 0: the server's default of 1 MiB).
	MaxPayload int32
	// ReadyTimeout bounds how long Start waits for the server to accept
	// connections (default 10s).
	ReadyTimeout time.Duration
}

// Server is a running in-process nats-server.
type Server struct {
	ns *server.Server
}

// Start starts a server and waits until it accepts connections.
func Start(cfg Config) (*Server, error) {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: listen address %q: %w", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("embedded nats: listen port %q is not a port number", portStr)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	ns, err := server.NewServer(&server.Options{
		Host:       host,
		Port:       port,
		MaxPayload: cfg.MaxPayload,
		NoLog:      true,
		NoSigs:     true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(cfg.ReadyTimeout) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, errors.New("embedded nats: not ready for connections within " + cfg.ReadyTimeout.String())
	}
	return &Server{ns: ns}, nil
}

// ClientURL is the nats:// URL clients connect to.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// Shutdown stops the server, closes its clients' connections and waits
// until every goroutine of the server has stopped.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}
