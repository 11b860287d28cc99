package embedded

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// routesPerPeer is how many route connections a server of this
// nats-server version keeps to each other server of its cluster: a pool of
// server.DEFAULT_ROUTE_POOL_SIZE shared by the accounts, plus one pinned to
// the system account. StartCluster waits for all of them.
const routesPerPeer = server.DEFAULT_ROUTE_POOL_SIZE + 1

// pollEvery is how often the joins are checked while StartCluster and
// StartSupercluster wait for them (bounded by JoinTimeout).
const pollEvery = 5 * time.Millisecond

// ClusterConfig configures a Cluster. The zero value is three servers
// named "ration-0" to "ration-2" on random loopback ports.
type ClusterConfig struct {
	// Name is the cluster's name, which is also its gateway name in a
	// supercluster (default "ration"; in a supercluster "ration-<index>").
	// No white space.
	Name string
	// Size is the number of servers (default 3). Server i is named
	// "<Name>-<i>".
	Size int
	// Server configures every server of the cluster. Its Listen port must
	// be 0 when Size > 1 (each server picks a free port); routes and
	// gateways listen on its host, also on free ports.
	Server Config
	// JoinTimeout bounds how long StartCluster waits, after the servers
	// accept connections, until every server has every route to every
	// other (default 10s).
	JoinTimeout time.Duration
}

// Cluster is a running set of servers joined by routes: a client of any
// server reaches the subscribers of all of them.
type Cluster struct {
	name    string
	servers []*Server
}

func (c ClusterConfig) withDefaults(name string) ClusterConfig {
	if c.Name == "" {
		c.Name = name
	}
	if c.Size == 0 {
		c.Size = 3
	}
	if c.JoinTimeout == 0 {
		c.JoinTimeout = 10 * time.Second
	}
	c.Server = c.Server.withDefaults()
	return c
}

// Validate reports whether c, with its defaults filled, is usable by
// StartCluster. The error wraps ErrInvalidConfig.
func (c ClusterConfig) Validate() error {
	_, _, err := c.withDefaults("ration").validate()
	return err
}

func (c ClusterConfig) validate() (string, int, error) {
	bad := func(format string, args ...any) (string, int, error) {
		return "", 0, fmt.Errorf("%w: cluster %q: %s", ErrInvalidConfig, c.Name, fmt.Sprintf(format, args...))
	}
	switch {
	case strings.ContainsAny(c.Name, " \t\r\n"):
		return bad("name has white space")
	case c.Size < 1:
		return bad("Size %d is below 1", c.Size)
	case c.JoinTimeout < 0:
		return bad("JoinTimeout %v is negative", c.JoinTimeout)
	}
	host, port, err := c.Server.validate()
	if err != nil {
		return "", 0, fmt.Errorf("cluster %q: %w", c.Name, err)
	}
	if port != 0 && c.Size > 1 {
		return bad("Server.Listen %q has a fixed port; %d servers cannot share it", c.Server.Listen, c.Size)
	}
	return host, port, nil
}

// StartCluster starts cfg.Size servers joined by routes and waits until
// every server accepts connections and has its routes to every other. On
// error every server it started has been shut down. The error wraps
// ErrInvalidConfig or ErrNotReady.
func StartCluster(cfg ClusterConfig) (*Cluster, error) {
	cfg = cfg.withDefaults("ration")
	host, port, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	c, err := startCluster(cfg, host, port, nil)
	if err != nil {
		return nil, err
	}
	if err := waitFor(cfg.JoinTimeout, c.joined); err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster %q: routes %v: %w", c.name, c.routes(), err)
	}
	return c, nil
}

// startCluster starts the servers of a validated config, each with routes
// to the ones started before it (the routes then gossip the full mesh).
// With gw non-nil every server also runs a gateway named after the cluster
// that dials the remote gateways in gw.
func startCluster(cfg ClusterConfig, host string, port int, gw []*server.RemoteGatewayOpts) (*Cluster, error) {
	c := &Cluster{name: cfg.Name}
	var routes []*url.URL
	for i := range cfg.Size {
		opts := cfg.Server.options(host, port)
		opts.ServerName = fmt.Sprintf("%s-%d", cfg.Name, i)
		opts.Cluster = server.ClusterOpts{Name: cfg.Name, Host: host, Port: server.RANDOM_PORT}
		opts.Routes = append([]*url.URL(nil), routes...)
		if gw != nil {
			opts.Gateway = server.GatewayOpts{Name: cfg.Name, Host: host, Port: server.RANDOM_PORT, Gateways: gw}
		}
		s, err := startServer(opts, cfg.Server.ReadyTimeout)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("cluster %q: server %d: %w", cfg.Name, i, err)
		}
		c.servers = append(c.servers, s)
		routes = append(routes, listenURL("nats-route", s.ns.ClusterAddr()))
	}
	return c, nil
}

// joined reports whether every server has all its routes.
func (c *Cluster) joined() bool {
	want := (len(c.servers) - 1) * routesPerPeer
	for _, s := range c.servers {
		if s.ns.NumRemotes() != len(c.servers)-1 || s.ns.NumRoutes() != want {
			return false
		}
	}
	return true
}

// routes lists the route connections of each server, for errors.
func (c *Cluster) routes() []int {
	n := make([]int, len(c.servers))
	for i, s := range c.servers {
		n[i] = s.ns.NumRoutes()
	}
	return n
}

// Name is the cluster's name.
func (c *Cluster) Name() string { return c.name }

// Servers returns the servers in order: Servers()[i] is "<Name>-<i>". A
// test may shut one down to show clients failing over to the others.
func (c *Cluster) Servers() []*Server { return append([]*Server(nil), c.servers...) }

// ClientURLs returns every server's client URL, in the order of Servers:
// give them all to nats.Connect (comma-separated) so that a client
// reconnects to another server when its own goes away.
func (c *Cluster) ClientURLs() []string {
	urls := make([]string, len(c.servers))
	for i, s := range c.servers {
		urls[i] = s.ClientURL()
	}
	return urls
}

// Close shuts every server down, including any already shut down (which
// is a no-op), and returns once all their goroutines have stopped. It
// returns nil.
func (c *Cluster) Close() error {
	for _, s := range c.servers {
		s.Close()
	}
	return nil
}

// waitFor polls cond until it holds, for at most timeout; the error wraps
// ErrNotReady.
func waitFor(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: not joined within %v", ErrNotReady, timeout)
		}
		<-t.C
	}
	return nil
}
