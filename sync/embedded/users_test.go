package embedded

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
)

var regions = []string{"us", "eu", "ap"}

func regionUsers() []User {
	var us []User
	for _, r := range regions {
		us = append(us, RegionUser("ration.sync", r, r+"-secret"))
	}
	return us
}

func TestRegionUser(t *testing.T) {
	got := RegionUser("ration.sync", "eu", "pw")
	want := User{Name: "eu", Password: "pw", Publish: []string{"ration.sync.eu"}, Subscribe: []string{"ration.sync.>"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("RegionUser (-want +got):\n%s", d)
	}
}

// TestRegionScoping shows, on a single server, a cluster and a
// supercluster, that a region's user may publish its own reports and
// receive every region's, while a report it publishes under another
// region's subject is rejected by the server and reaches nobody.
func TestRegionScoping(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) (urls map[string]string, closer func() error)
	}{
		{"server", func(t *testing.T) (map[string]string, func() error) {
			s, err := Start(Config{Users: regionUsers()})
			if err != nil {
				t.Fatal(err)
			}
			return map[string]string{"us": s.ClientURL(), "eu": s.ClientURL(), "ap": s.ClientURL()}, s.Close
		}},
		{"cluster", func(t *testing.T) (map[string]string, func() error) {
			c, err := StartCluster(ClusterConfig{Server: Config{Users: regionUsers()}})
			if err != nil {
				t.Fatal(err)
			}
			u := c.ClientURLs()
			return map[string]string{"us": u[0], "eu": u[1], "ap": u[2]}, c.Close
		}},
		{"supercluster", func(t *testing.T) (map[string]string, func() error) {
			var ccs []ClusterConfig
			for _, r := range regions {
				ccs = append(ccs, ClusterConfig{Name: r, Size: 2, Server: Config{Users: regionUsers()}})
			}
			sc, err := StartSupercluster(SuperclusterConfig{Clusters: ccs})
			if err != nil {
				t.Fatal(err)
			}
			urls := map[string]string{}
			for _, c := range sc.Clusters() {
				urls[c.Name()] = c.ClientURLs()[1]
			}
			return urls, sc.Close
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			urls, closer := tc.start(t)
			defer closer()
			checkScoping(t, urls)
		})
	}
}

func checkScoping(t *testing.T, urls map[string]string) {
	if _, err := nats.Connect(urls["us"], nats.NoReconnect()); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("connecting without credentials: got %v, want nats.ErrAuthorization", err)
	}
	if _, err := nats.Connect(urls["us"], nats.NoReconnect(), nats.UserInfo("us", "wrong")); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("connecting with a wrong password: got %v, want nats.ErrAuthorization", err)
	}

	asyncErr := make(chan error, 8)
	us := connect(t, urls["us"], nats.UserInfo("us", "us-secret"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		asyncErr <- err
	}))
	eu := connect(t, urls["eu"], nats.UserInfo("eu", "eu-secret"))
	ap := connect(t, urls["ap"], nats.UserInfo("ap", "ap-secret"))

	// Every region receives every region's subject; us reaches both.
	var subs []*nats.Subscription
	for _, nc := range []*nats.Conn{eu, ap} {
		s, err := nc.SubscribeSync("ration.sync.>")
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
		reach(t, us, nc, "ration.sync.us")
	}

	// us forges eu's report, then publishes its own marker. The server
	// rejects the forgery; messages of one connection arrive in order, so
	// a subscriber that sees the marker without the forgery never will.
	if err := us.Publish("ration.sync.eu", []byte("forged")); err != nil {
		t.Fatal(err)
	}
	if err := us.Publish("ration.sync.us", []byte("marker")); err != nil {
		t.Fatal(err)
	}
	for i, s := range subs {
		for {
			m, err := s.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("subscriber %d: waiting for us's marker: %v", i, err)
			}
			if string(m.Data) == "forged" || m.Subject != "ration.sync.us" {
				t.Fatalf("subscriber %d received %q on %s from us, want only us's own subject", i, m.Data, m.Subject)
			}
			if string(m.Data) == "marker" {
				break
			}
		}
	}

	select {
	case err := <-asyncErr:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "ration.sync.eu") {
			t.Errorf("got async error %v, want a permissions violation on ration.sync.eu", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not reject us's publish on ration.sync.eu within 10s")
	}

	// A region may not subscribe outside the exchange's subjects either.
	if _, err := us.SubscribeSync("policy.>"); err != nil {
		t.Fatal(err)
	}
	if err := us.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-asyncErr:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "policy.>") {
			t.Errorf("got async error %v, want a permissions violation on policy.>", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not reject us's subscription to policy.> within 10s")
	}
	if !us.IsConnected() {
		t.Errorf("us was disconnected by the violations, want it connected")
	}
	reach(t, us, eu, "ration.sync.us")
}

// TestUserPermissionsNil shows nil lists allowing every subject and an
// empty list allowing none.
func TestUserPermissionsNil(t *testing.T) {
	s, err := Start(Config{Users: []User{
		{Name: "all", Password: "p"},
		{Name: "none", Password: "p", Publish: []string{}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	all := connect(t, s.ClientURL(), nats.UserInfo("all", "p"))
	reach(t, all, all, "any.subject")

	asyncErr := make(chan error, 1)
	none := connect(t, s.ClientURL(), nats.UserInfo("none", "p"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case asyncErr <- err:
		default:
		}
	}))
	if err := none.Publish("any.subject", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-asyncErr:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("got async error %v, want a permissions violation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not reject a publish of a user with an empty allow list within 10s")
	}
}
