package embedded

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no port", Config{Listen: "127.0.0.1"}},
		{"bad port", Config{Listen: "127.0.0.1:http"}},
		{"port out of range", Config{Listen: "127.0.0.1:70000"}},
		{"negative payload", Config{MaxPayload: -1}},
		{"negative timeout", Config{ReadyTimeout: -time.Second}},
		{"user without name", Config{Users: []User{{Password: "p"}}}},
		{"user name with space", Config{Users: []User{{Name: "a b", Password: "p"}}}},
		{"user without password", Config{Users: []User{{Name: "us"}}}},
		{"user twice", Config{Users: []User{{Name: "us", Password: "p"}, {Name: "us", Password: "q"}}}},
		{"bad publish subject", Config{Users: []User{{Name: "us", Password: "p", Publish: []string{"a..b"}}}}},
		{"bad subscribe subject", Config{Users: []User{{Name: "us", Password: "p", Subscribe: []string{"a.>.b"}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Start(tc.cfg)
			if err == nil {
				s.Close()
				t.Fatalf("Start(%+v) succeeded, want an error", tc.cfg)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got error %v, want one wrapping ErrInvalidConfig", err)
			}
		})
	}
}

func TestClusterInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  ClusterConfig
	}{
		{"negative size", ClusterConfig{Size: -1}},
		{"name with space", ClusterConfig{Name: "a b"}},
		{"fixed port for three", ClusterConfig{Server: Config{Listen: "127.0.0.1:4222"}}},
		{"negative timeout", ClusterConfig{JoinTimeout: -time.Second}},
		{"bad server", ClusterConfig{Server: Config{Users: []User{{Name: "us"}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := StartCluster(tc.cfg)
			if err == nil {
				c.Close()
				t.Fatalf("StartCluster(%+v) succeeded, want an error", tc.cfg)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got error %v, want one wrapping ErrInvalidConfig", err)
			}
		})
	}
	for _, tc := range []struct {
		name string
		cfg  SuperclusterConfig
	}{
		{"no clusters", SuperclusterConfig{}},
		{"one cluster", SuperclusterConfig{Clusters: []ClusterConfig{{}}}},
		{"same name", SuperclusterConfig{Clusters: []ClusterConfig{{Name: "us"}, {Name: "us"}}}},
		{"bad cluster", SuperclusterConfig{Clusters: []ClusterConfig{{Name: "us"}, {Size: -1}}}},
		{"negative timeout", SuperclusterConfig{Clusters: []ClusterConfig{{}, {}}, JoinTimeout: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := StartSupercluster(tc.cfg)
			if err == nil {
				sc.Close()
				t.Fatalf("StartSupercluster(%+v) succeeded, want an error", tc.cfg)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got error %v, want one wrapping ErrInvalidConfig", err)
			}
		})
	}
}

// TestStartDefaults keeps the single-server API that regiond uses: a
// server on a random loopback port that accepts anyone.
func TestStartDefaults(t *testing.T) {
	s, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if u := s.ClientURL(); !strings.HasPrefix(u, "nats://127.0.0.1:") {
		t.Errorf("got client URL %q, want nats://127.0.0.1:<port>", u)
	}
	nc := connect(t, s.ClientURL())
	sub, err := nc.SubscribeSync("x")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("x", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(5 * time.Second); err != nil || string(m.Data) != "hi" {
		t.Fatalf("got %v, %v, want the message hi", m, err)
	}
}

// TestCluster shows a three-server cluster forming and carrying messages
// between clients of different servers, and Close stopping them all.
func TestCluster(t *testing.T) {
	start := time.Now()
	c, err := StartCluster(ClusterConfig{Name: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("3-server cluster joined in %v", time.Since(start))
	defer c.Close()
	srv := c.Servers()
	if len(srv) != 3 {
		t.Fatalf("got %d servers, want 3", len(srv))
	}
	urls := c.ClientURLs()
	for i, s := range srv {
		if want := fmt.Sprintf("eu-%d", i); s.Name() != want {
			t.Errorf("server %d is named %q, want %q", i, s.Name(), want)
		}
		if urls[i] != s.ClientURL() {
			t.Errorf("ClientURLs()[%d] = %q, want %q", i, urls[i], s.ClientURL())
		}
	}
	for i := range srv {
		pub := connect(t, urls[i])
		sub := connect(t, urls[(i+1)%len(urls)])
		reach(t, pub, sub, "ration.sync.us")
	}
	c.Close()
	for i, s := range srv {
		if s.Running() {
			t.Errorf("server %d still running after Close", i)
		}
	}
}

// TestClusterFailover gives a client every server of a cluster, shuts its
// server down and shows nats.go reconnecting to another that still
// reaches the remaining subscribers.
func TestClusterFailover(t *testing.T) {
	c, err := StartCluster(ClusterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	urls := c.ClientURLs()
	reconnected := make(chan string, 1)
	pub, err := nats.Connect(strings.Join(urls, ","), nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(10*time.Millisecond),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			select {
			case reconnected <- nc.ConnectedUrl():
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if got := pub.ConnectedUrl(); got != urls[0] {
		t.Fatalf("connected to %s, want the first URL %s", got, urls[0])
	}
	sub := connect(t, urls[2])
	reach(t, pub, sub, "a")

	c.Servers()[0].Close()
	select {
	case u := <-reconnected:
		if u == urls[0] {
			t.Fatalf("reconnected to the server that was shut down, %s", u)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnect within 10s")
	}
	reach(t, pub, sub, "b")
}

// TestSupercluster shows three clusters joined by gateways carrying
// messages between clients of servers in different clusters; the unnamed
// one gets its default name.
func TestSupercluster(t *testing.T) {
	start := time.Now()
	sc, err := StartSupercluster(SuperclusterConfig{Clusters: []ClusterConfig{{Name: "us", Size: 2}, {Name: "eu", Size: 2}, {Size: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("supercluster of 2+2+1 servers joined in %v", time.Since(start))
	defer sc.Close()
	cs := sc.Clusters()
	var names []string
	for _, c := range cs {
		names = append(names, c.Name())
	}
	if d := cmp.Diff([]string{"us", "eu", "ration-2"}, names); d != "" {
		t.Fatalf("cluster names (-want +got):\n%s", d)
	}
	for i, from := range cs {
		to := cs[(i+1)%len(cs)]
		pub := connect(t, from.ClientURLs()[0])
		sub := connect(t, to.ClientURLs()[len(to.ClientURLs())-1])
		reach(t, pub, sub, "ration.sync."+from.Name())
	}
}

func connect(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(10 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// reach subscribes sub to subject and publishes probes from pub until one
// arrives: interest travels between servers asynchronously, so a message
// sent before it arrives is dropped. Bounded by a deadline.
func reach(t *testing.T, pub, sub *nats.Conn, subject string) {
	t.Helper()
	s, err := sub.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Unsubscribe() }()
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; ; n++ {
		if err := pub.Publish(subject, []byte("probe")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.NextMsg(20 * time.Millisecond); err == nil {
			return
		} else if !errors.Is(err, nats.ErrTimeout) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d probes on %s from %s never reached %s", n+1, subject, pub.ConnectedUrl(), sub.ConnectedUrl())
		}
	}
}
