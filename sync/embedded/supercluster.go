package embedded

import (
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// SuperclusterConfig configures a Supercluster.
type SuperclusterConfig struct {
	// Clusters are the clusters to join, at least two, each with the
	// defaults of ClusterConfig except that an empty Name becomes
	// "ration-<index>". Names must be unique: a name is also the cluster's
	// gateway name. Users are per server: give every cluster the users
	// that its clients connect as.
	Clusters []ClusterConfig
	// JoinTimeout bounds how long StartSupercluster waits, after every
	// cluster has formed, until every server has a gateway to every other
	// cluster (default 10s). A server dials its gateways only after an
	// initial delay of nats-server's (1s), so the wait takes that long.
	JoinTimeout time.Duration
}

// withDefaults returns c with its defaults filled, the clusters' included.
func (c SuperclusterConfig) withDefaults() SuperclusterConfig {
	if c.JoinTimeout == 0 {
		c.JoinTimeout = 10 * time.Second
	}
	ccs := make([]ClusterConfig, len(c.Clusters))
	for i, cc := range c.Clusters {
		ccs[i] = cc.withDefaults(fmt.Sprintf("ration-%d", i))
	}
	c.Clusters = ccs
	return c
}

// Validate reports whether c, with its defaults filled, is usable by
// StartSupercluster. The error wraps ErrInvalidConfig.
func (c SuperclusterConfig) Validate() error {
	_, _, _, err := c.withDefaults().validate()
	return err
}

// validate checks a SuperclusterConfig with its defaults filled and returns
// its clusters with their listen hosts and ports.
func (c SuperclusterConfig) validate() (ccs []ClusterConfig, hosts []string, ports []int, err error) {
	if len(c.Clusters) < 2 {
		return nil, nil, nil, fmt.Errorf("%w: a supercluster needs 2 clusters or more, got %d", ErrInvalidConfig, len(c.Clusters))
	}
	if c.JoinTimeout < 0 {
		return nil, nil, nil, fmt.Errorf("%w: JoinTimeout %v is negative", ErrInvalidConfig, c.JoinTimeout)
	}
	hosts, ports = make([]string, len(c.Clusters)), make([]int, len(c.Clusters))
	names := make(map[string]bool, len(c.Clusters))
	for i, cc := range c.Clusters {
		host, port, err := cc.validate()
		if err != nil {
			return nil, nil, nil, err
		}
		if names[cc.Name] {
			return nil, nil, nil, fmt.Errorf("%w: cluster name %q used twice", ErrInvalidConfig, cc.Name)
		}
		names[cc.Name] = true
		hosts[i], ports[i] = host, port
	}
	return c.Clusters, hosts, ports, nil
}

// Supercluster is a running set of clusters joined by gateways, as a
// deployment with one NATS cluster per region runs: a client of any
// server reaches the subscribers of every cluster.
type Supercluster struct {
	clusters []*Cluster
}

// StartSupercluster starts the clusters of cfg, each joined to every other
// by gateways, and waits until every cluster has its routes and every
// server has its gateways to every other cluster and the other clusters'
// gateways to it. On error every server it started has been shut down.
// The error wraps ErrInvalidConfig or ErrNotReady.
func StartSupercluster(cfg SuperclusterConfig) (*Supercluster, error) {
	cfg = cfg.withDefaults()
	ccs, hosts, ports, err := cfg.validate()
	if err != nil {
		return nil, err
	}

	// Cluster i dials the gateways of clusters 0..i-1; those learn of it
	// from its connections and dial back (implicit gateways).
	sc := &Supercluster{}
	remotes := []*server.RemoteGatewayOpts{}
	for i, cc := range ccs {
		c, err := startCluster(cc, hosts[i], ports[i], remotes)
		if err == nil {
			if err = waitFor(cc.JoinTimeout, c.joined); err != nil {
				c.Close()
				err = fmt.Errorf("cluster %q: routes %v: %w", c.name, c.routes(), err)
			}
		}
		if err != nil {
			sc.Close()
			return nil, err
		}
		sc.clusters = append(sc.clusters, c)
		rg := &server.RemoteGatewayOpts{Name: c.name}
		for _, s := range c.servers {
			rg.URLs = append(rg.URLs, listenURL("nats", s.ns.GatewayAddr()))
		}
		remotes = append(append([]*server.RemoteGatewayOpts(nil), remotes...), rg)
	}
	if err := waitFor(cfg.JoinTimeout, sc.joined); err != nil {
		sc.Close()
		return nil, fmt.Errorf("gateways: %w", err)
	}
	return sc, nil
}

// joined reports whether every server has an outbound gateway to every
// other cluster and every cluster has one inbound gateway from each server
// of every other cluster.
func (sc *Supercluster) joined() bool {
	for _, c := range sc.clusters {
		inbound := map[string]int{}
		for _, s := range c.servers {
			if s.ns.NumOutboundGateways() != len(sc.clusters)-1 {
				return false
			}
			gz, err := s.ns.Gatewayz(&server.GatewayzOptions{})
			if err != nil {
				return false
			}
			for name, conns := range gz.InboundGateways {
				inbound[name] += len(conns)
			}
		}
		for _, o := range sc.clusters {
			if o != c && inbound[o.name] != len(o.servers) {
				return false
			}
		}
	}
	return true
}

// Clusters returns the clusters in the order of SuperclusterConfig.Clusters.
func (sc *Supercluster) Clusters() []*Cluster { return append([]*Cluster(nil), sc.clusters...) }

// Close shuts every server of every cluster down and returns once all
// their goroutines have stopped. It returns nil.
func (sc *Supercluster) Close() error {
	for _, c := range sc.clusters {
		c.Close()
	}
	return nil
}
