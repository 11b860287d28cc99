package faults

import (
	"github.com/ration-dev/ration/internal/cutproxy"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// routeCut is how long TestFaultNATSRouteCut cuts the route: 30 s, 60 of
// the matrix's sync periods (the exchange counts a region stale after 3).
const routeCut = 30 * time.Second

// TestFaultNATSRouteCut: the regions' NATS is a cluster of three servers,
// one per region, each region's regiond on its own; the route between eu's
// and us's server is cut for routeCut, then healed. Each region still
// reaches ap, and its Redis and its agents: a partition of the exchange
// only. NATS routes do not forward another server's messages, so eu and us
// hear nothing of each other while it lasts (checked).
func TestFaultNATSRouteCut(t *testing.T) {
	needFaults(t)
	srv, link := startRoutedNATS(t)
	urls := map[string]string{}
	for r, s := range srv {
		urls[r] = s.ClientURL()
	}
	w := newWorld(t, nil, urls)
	w.startRegions()
	w.steady()

	began := time.Now()
	link.Cut()
	waitUntil(t, 10*time.Second, "eu's and us's servers lose their route", func() bool {
		return srv["eu"].NumRemotes() == 1 && srv["us"].NumRemotes() == 1
	})
	checkPartition(t, urls["us"], urls["eu"], false)
	checkPartition(t, urls["us"], urls["ap"], true)
	w.run(time.Until(began.Add(routeCut)))
	if srv["eu"].NumRemotes() != 1 || srv["us"].NumRemotes() != 1 {
		t.Fatalf("the cut route came back by another way: eu's server has %d remotes, us's %d", srv["eu"].NumRemotes(), srv["us"].NumRemotes())
	}
	ended := time.Now()
	link.Mend()
	waitUntil(t, 15*time.Second, "the route is back", func() bool {
		return srv["eu"].NumRemotes() == 2 && srv["us"].NumRemotes() == 2
	})
	t.Logf("the route was back %v after the heal", time.Since(ended).Round(time.Millisecond))
	w.row("nats-route-cut", began, ended)
}

// startRoutedNATS starts three embedded nats-servers joined by routes,
// named after the regions; us's route to eu goes through the returned
// proxy (us dials it; eu only accepts, so nothing dials around it), ap's
// go direct. It waits until every server has both remotes.
func startRoutedNATS(t *testing.T) (map[string]*server.Server, *cutproxy.Proxy) {
	t.Helper()
	start := func(name string, routes ...string) *server.Server {
		o := &server.Options{
			ServerName: name, Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
			Cluster: server.ClusterOpts{Name: "faults", Host: "127.0.0.1", Port: server.RANDOM_PORT},
		}
		for _, r := range routes {
			u, err := url.Parse("nats-route://" + r)
			if err != nil {
				t.Fatal(err)
			}
			o.Routes = append(o.Routes, u)
		}
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("nats-server %s not ready", name)
		}
		return s
	}
	eu := start("eu")
	link := cutproxy.Start(t, eu.ClusterAddr().String())
	us := start("us", link.Addr())
	ap := start("ap", eu.ClusterAddr().String(), us.ClusterAddr().String())
	srv := map[string]*server.Server{"ap": ap, "eu": eu, "us": us}
	waitUntil(t, 10*time.Second, "the three servers join", func() bool {
		for _, s := range srv {
			if s.NumRemotes() != 2 {
				return false
			}
		}
		return true
	})
	return srv, link
}

// checkPartition publishes from a client of one server to a subscriber
// on another and checks whether it arrives, as want says.
func checkPartition(t *testing.T, from, to string, want bool) {
	t.Helper()
	sub, err := nats.Connect(to)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	pub, err := nats.Connect(from)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ch := make(chan *nats.Msg, 16)
	s, err := sub.ChanSubscribe("faults.probe", ch)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Unsubscribe()
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	// Interest crosses a route asynchronously: publish for a while.
	deadline := time.After(time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ch:
			if !want {
				t.Fatalf("a message from %s reached %s across the cut route", from, to)
			}
			return
		case <-tick.C:
			_ = pub.Publish("faults.probe", []byte("x"))
		case <-deadline:
			if want {
				t.Fatalf("no message from %s reached %s within 1s", from, to)
			}
			return
		}
	}
}
