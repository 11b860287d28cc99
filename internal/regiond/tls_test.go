package regiond

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/internal/tlsfiles/tlstest"
	"github.com/ration-dev/ration/lease/agent"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

const tlsPolicy = `
rules:
  - name: per-tenant
    key: [tenant]
    limit: 1000
    period: 1s
  - name: payments
    key: [account]
    limit: 1000
    clients: ["spiffe://ration.test/payments/*"]
`

// tlsClient is a lease API client over TLS with files f.
func tlsClient(t *testing.T, d *Daemon, f tlsfiles.Files) leasev1.LeaseServiceClient {
	t.Helper()
	cfg, err := tlsfiles.Client(f)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(d.LeaseAddr(), grpc.WithTransportCredentials(cfg.Credentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return leasev1.NewLeaseServiceClient(conn)
}

// TestLeaseAPIMutualTLS: regiond serving the lease API with mTLS grants a
// client holding a certificate of its CA, and refuses, granting nothing, a
// client without one, with one of another CA, or an expired one; an agent
// configured with its files decides on leases; the server's certificate,
// rotated on disk, is used without a restart.
func TestLeaseAPIMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "ration test CA")
	caPath := tlstest.Write(t, dir, "ca.pem", ca.PEM)
	sc, sk := ca.Issue(t, tlstest.Leaf{Name: "regiond", DNS: []string{"regiond.eu.test"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	cc, ck := ca.Issue(t, tlstest.Leaf{Name: "gateway", URIs: []string{"spiffe://ration.test/gateway"}, Client: true})
	good := tlsfiles.Files{Cert: tlstest.Write(t, dir, "client.pem", cc), Key: tlstest.Write(t, dir, "client-key.pem", ck), CA: caPath, ServerName: "regiond.eu.test"}
	d := startDaemon(t, Config{
		PolicyYAML: []byte(tlsPolicy),
		TLSCert:    tlstest.Write(t, dir, "server.pem", sc), TLSKey: tlstest.Write(t, dir, "server-key.pem", sk), TLSClientCA: caPath,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	resp, err := leaseOne(ctx, tlsClient(t, d, good), "per-tenant", "tenant=acme", 10)
	if err != nil || resp.Grants[0].GetGranted() != 10 {
		t.Fatalf("with a valid client certificate: %v, %v", resp, err)
	}

	other := tlstest.NewCA(t, "another CA")
	oc, ok := other.Issue(t, tlstest.Leaf{Name: "intruder", Client: true})
	ec, ek := ca.Issue(t, tlstest.Leaf{Name: "old", Client: true, NotAfter: time.Now().Add(-time.Minute)})
	granted, _ := d.Service().StoreItems()
	for _, tc := range []struct {
		name string
		f    tlsfiles.Files
	}{
		{"no certificate", tlsfiles.Files{CA: caPath, ServerName: "regiond.eu.test"}},
		{"another CA", tlsfiles.Files{Cert: tlstest.Write(t, dir, "o.pem", oc), Key: tlstest.Write(t, dir, "ok.pem", ok), CA: caPath, ServerName: "regiond.eu.test"}},
		{"expired", tlsfiles.Files{Cert: tlstest.Write(t, dir, "e.pem", ec), Key: tlstest.Write(t, dir, "ek.pem", ek), CA: caPath, ServerName: "regiond.eu.test"}},
	} {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := leaseOne(cctx, tlsClient(t, d, tc.f), "per-tenant", "tenant=acme", 10)
		ccancel()
		if err == nil {
			t.Errorf("%s: the lease call succeeded", tc.name)
		}
	}
	// Plain text, too, is refused.
	cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = leaseOne(cctx, client(t, d), "per-tenant", "tenant=acme", 10)
	ccancel()
	if err == nil {
		t.Error("a plaintext lease call succeeded")
	}
	if now, _ := d.Service().StoreItems(); now != granted {
		t.Errorf("refused calls reached the store: %d grant items, %d before", now, granted)
	}

	// A rule whose clients do not name the caller refuses it, whole, with
	// PermissionDenied, before the store; a caller it names leases.
	pc, pk := ca.Issue(t, tlstest.Leaf{Name: "payments", URIs: []string{"spiffe://ration.test/payments/gw-1"}, Client: true})
	payer := tlsfiles.Files{Cert: tlstest.Write(t, dir, "pay.pem", pc), Key: tlstest.Write(t, dir, "pay-key.pem", pk), CA: caPath, ServerName: "regiond.eu.test"}
	items0, _ := d.Service().StoreItems()
	_, err = tlsClient(t, d, good).Lease(ctx, &leasev1.LeaseRequest{Agent: &leasev1.Agent{Id: "gw"}, Items: []*leasev1.LeaseItem{
		{Rule: "per-tenant", Key: "tenant=acme", Want: 1}, {Rule: "payments", Key: "account=7", Want: 1},
	}})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("the gateway leasing payments: got %v, want PermissionDenied", err)
	}
	_, err = tlsClient(t, d, good).Return(ctx, &leasev1.ReturnRequest{Agent: &leasev1.Agent{Id: "gw"}, Items: []*leasev1.ReturnItem{{Rule: "payments", Key: "account=7", Tokens: 100}}})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("the gateway returning payments tokens: got %v, want PermissionDenied", err)
	}
	if now, _ := d.Service().StoreItems(); now != items0 {
		t.Errorf("a refused call reached the store")
	}
	if resp, err := leaseOne(ctx, tlsClient(t, d, payer), "payments", "account=7", 5); err != nil || resp.Grants[0].GetGranted() != 5 {
		t.Errorf("the payments client leasing payments: %v, %v", resp, err)
	}
	if n := refused(t, d, "lease", "payments", "spiffe://ration.test/gateway"); n != 1 {
		t.Errorf("ration_lease_refused_total{rpc=lease,rule=payments,client=the gateway} = %v, want 1", n)
	}

	// An agent with the same files decides on leases.
	a, err := agent.New(agent.Config{Target: d.LeaseAddr(), RegiondCA: caPath, TLSCert: good.Cert, TLSKey: good.Key, RegiondServerName: "regiond.eu.test", Logger: quietLogger(),
		// The check is that mTLS works, not the 5 ms default: under CI's
		// -race on two cores the first handshake and lease can take longer.
		RoundTripTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.WaitPolicy(ctx); err != nil {
		t.Fatalf("agent over mTLS: %v", err)
	}
	if dec := a.Allow(ctx, []policy.Descriptor{{Key: "tenant", Value: "globex"}}, 1); !dec.Allowed || dec.Path != agent.PathLease {
		t.Fatalf("agent over mTLS: %+v, want a leased admission", dec)
	}

	// The server's certificate rotates on disk: new handshakes get it.
	serial := func() string {
		ct, err := tlsfiles.Client(good)
		if err != nil {
			t.Fatal(err)
		}
		cfg := ct.For("")
		cfg.NextProtos = []string{"h2"}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", d.LeaseAddr(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serial()
	sc2, sk2 := ca.Issue(t, tlstest.Leaf{Name: "regiond", DNS: []string{"regiond.eu.test"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	tlstest.Write(t, dir, "server-key.pem", sk2)
	tlstest.Write(t, dir, "server.pem", sc2)
	deadline := time.Now().Add(10 * time.Second) // files are looked at every second
	for serial() == before {
		if time.Now().After(deadline) {
			t.Fatal("the rotated server certificate was not used within 10s")
		}
		<-time.After(50 * time.Millisecond)
	}
}

// TestPlaintextRefusedBeyondLoopback: a lease API that would listen in
// plain text on an address other than loopback is refused unless
// Insecure; TLS files must come in pairs.
func TestPlaintextRefusedBeyondLoopback(t *testing.T) {
	for _, tc := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{Listen: "0.0.0.0:7070"}, false},
		{Config{Listen: ":7070"}, false},
		{Config{Listen: "10.0.0.1:7070"}, false},
		{Config{Listen: ":7070", Insecure: true}, true},
		{Config{Listen: "127.0.0.1:7070"}, true},
		{Config{Listen: "[::1]:7070"}, true},
		{Config{Listen: "localhost:7070"}, true},
		{Config{Listen: ":7070", TLSCert: "c.pem", TLSKey: "k.pem"}, true},
		{Config{Listen: ":7070", TLSCert: "c.pem"}, false},
		{Config{Listen: "127.0.0.1:7070", TLSClientCA: "ca.pem"}, false},
	} {
		err := tc.cfg.Validate()
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: got %v, want ok %v", tc.cfg, err, tc.ok)
		}
	}
}

// refused returns the value of the refusal counter's series.
func refused(t *testing.T, d *Daemon, rpc, rule, client string) float64 {
	t.Helper()
	return metricSum(t, d, "ration_lease_refused_total", "rpc", rpc, "rule", rule, "client", client)
}

// TestAdminToken: with -admin-token-file, /metrics needs the bearer token;
// the probes stay open.
func TestAdminToken(t *testing.T) {
	path := tlstest.Write(t, t.TempDir(), "token", []byte("an-admin-token-of-some-length\n"))
	d := startDaemon(t, Config{AdminTokenFile: path})
	base := "http://" + d.AdminAddr()
	req := func(p, auth string) int {
		r, err := http.NewRequest("GET", base+p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path, auth string
		want       int
	}{
		{"/metrics", "", 401},
		{"/metrics", "Bearer nope", 401},
		{"/metrics", "Bearer an-admin-token-of-some-length", 200},
		{"/healthz", "", 200},
		{"/readyz", "", 200},
	} {
		if got := req(tc.path, tc.auth); got != tc.want {
			t.Errorf("GET %s with %q: got %d, want %d", tc.path, tc.auth, got, tc.want)
		}
	}
	if _, err := New(Config{AdminTokenFile: tlstest.Write(t, t.TempDir(), "short", []byte("short"))}); err == nil {
		t.Error("a token of 5 bytes was accepted")
	}
}
