package regiond

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/ration-dev/ration/internal/cutproxy"
	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/internal/tlsfiles/tlstest"
	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/sync/embedded"
)

// secureDeployment is the TLS of a deployment's every connection: one CA;
// each region's Redis serves TLS only and admits regiond as redisACL's
// user; NATS serves TLS with client certificates and admits each region as
// an nkey user that may publish its own reports only; the lease API
// requires the agents' client certificates.
type secureDeployment struct {
	ca     string // the CA bundle's path
	server tlsfiles.Files
	client tlsfiles.Files // regiond's, to Redis and NATS
	agent  tlsfiles.Files // the agents', to the lease API
	nats   string         // NATS's URL
	seeds  map[string]string
}

const redisPassword = "a-redis-password-for-ration"

func newSecureDeployment(t *testing.T, regions ...string) *deployment {
	t.Helper()
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "deployment CA")
	s := &secureDeployment{ca: tlstest.Write(t, dir, "ca.pem", ca.PEM), seeds: map[string]string{}}
	issue := func(name string, l tlstest.Leaf) tlsfiles.Files {
		c, k := ca.Issue(t, l)
		return tlsfiles.Files{Cert: tlstest.Write(t, dir, name+".pem", c), Key: tlstest.Write(t, dir, name+"-key.pem", k), CA: s.ca}
	}
	loop := []net.IP{net.IPv4(127, 0, 0, 1)}
	s.server = issue("server", tlstest.Leaf{Name: "server", IPs: loop, Server: true})
	s.client = issue("regiond", tlstest.Leaf{Name: "regiond", Client: true})
	s.agent = issue("agent", tlstest.Leaf{Name: "agent", URIs: []string{"spiffe://ration.test/gateway"}, Client: true})
	s.agent.ServerName = "127.0.0.1"

	var users []embedded.User
	for _, r := range regions {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		s.seeds[r] = tlstest.Write(t, dir, r+".nk", seed)
		u := embedded.RegionUser("ration.sync", r, "")
		u.Password, u.Nkey = "", pub
		users = append(users, u)
	}
	srvTLS, err := tlsfiles.Server(s.server)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := embedded.Start(embedded.Config{TLS: srvTLS, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	s.nats = ns.ClientURL()

	ping, err := tlsfiles.Client(s.client)
	if err != nil {
		t.Fatal(err)
	}
	dep := &deployment{t: t, regions: regions, nodes: map[string][]*Daemon{}, proxies: map[string]*cutproxy.Proxy{},
		redis: map[string]string{}, servers: map[string]*redistest.Server{}, secure: s}
	for _, r := range regions {
		dep.proxies[r] = cutproxy.Start(t, strings.TrimPrefix(s.nats, "tls://")) // a server with TLS says tls://
		srv := redistest.StartTLSServer(t, redistest.TLS{Cert: s.server.Cert, Key: s.server.Key, CA: s.ca, Client: ping.For("127.0.0.1")},
			append([]string{"--user", "ration"}, strings.Fields(redisACL)...)...)
		dep.servers[r] = srv
		dep.redis[r] = "rediss://ration:" + redisPassword + "@" + srv.Addr() + "/0"
	}
	return dep
}

// configure sets region r's TLS and credentials.
func (s *secureDeployment) configure(r string, cfg *Config) {
	cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA = s.server.Cert, s.server.Key, s.ca
	cfg.RedisCA, cfg.RedisCert, cfg.RedisKey = s.ca, s.client.Cert, s.client.Key
	cfg.NATSCA, cfg.NATSCert, cfg.NATSKey, cfg.NATSNkey = s.ca, s.client.Cert, s.client.Key, s.seeds[r]
}

// TestThreeRegionsOverTLS is the exchange end to end with TLS on every
// connection: agents call the lease API with client certificates, each
// regiond talks to its TLS-only Redis as an ACL user and to NATS over TLS
// as its region's nkey user, and the agent library decides over mTLS in
// every region. Demand moves from us to eu and eu's share
// follows; the shares never sum above 1; no NATS permission error.
func TestThreeRegionsOverTLS(t *testing.T) {
	regions := []string{"ap", "eu", "us"}
	dep := newSecureDeployment(t, regions...)
	for _, r := range regions {
		dep.add(r, r+"-0")
	}
	phase1 := map[string]int64{"us": 900, "eu": 100}
	l := dep.load(phase1)
	dep.observe("us takes the share", 15*time.Second, func(sh map[string]int64) bool {
		return within5(sh, targets(regions, phase1), regions...)
	})
	phase2 := map[string]int64{"us": 100, "eu": 900}
	l.set(phase2)
	sh, took := dep.observe("eu takes the share", 15*time.Second, func(sh map[string]int64) bool {
		return within5(sh, targets(regions, phase2), regions...)
	})
	t.Logf("over TLS everywhere, the shares reached the new targets in %v: %v", took, sh)
	// The agent library, too, decides in every region over mTLS.
	for _, r := range regions {
		a, err := agent.New(agent.Config{Target: dep.nodes[r][0].LeaseAddr(), RegiondCA: dep.secure.ca, TLSCert: dep.secure.agent.Cert,
			TLSKey: dep.secure.agent.Key, RegiondServerName: "127.0.0.1", Logger: quietLogger(), RoundTripTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := a.WaitPolicy(ctx); err != nil {
			t.Fatalf("%s: agent over mTLS: %v", r, err)
		}
		if dec := a.Allow(ctx, []policy.Descriptor{{Key: "tenant", Value: "globex-" + r}}, 1); !dec.Allowed || dec.Path != agent.PathLease {
			t.Errorf("%s: agent over mTLS decided %+v, want a leased admission", r, dec)
		}
		cancel()
		a.Close()
	}
	for _, r := range regions {
		d := dep.nodes[r][0]
		if n := metricSum(t, d, "ration_nats_async_errors_total"); n != 0 {
			t.Errorf("%s: %v NATS errors (a permission violation?)", r, n)
		}
		if n := metricSum(t, d, "ration_exchange_store_errors_total"); n != 0 {
			t.Errorf("%s: %v exchange store errors", r, n)
		}
	}
}
