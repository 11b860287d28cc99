package main

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/internal/adminapi"
	"github.com/ration-dev/ration/internal/tlsfiles/tlstest"
)

// status is region's answer: ready, on Redis, revision 12, running its
// exchange, hearing its peers at the given ages (negative: never).
func status(region string, ages map[string]float64) adminapi.Status {
	s := adminapi.Status{
		Region: region, Replica: region + "-0", Version: "v0.9.0", Ready: true, Uptime: 3725,
		Store:  adminapi.Store{Kind: "redis", OK: true},
		Policy: adminapi.Policy{Source: "nats-kv://ration-policy", Revision: 12, Version: "3fa2c1", Rules: 4},
		Exchange: &adminapi.ExchangeStatus{
			Holder: true, Period: 1, Epoch: 3720, Keys: 42, Resting: 30,
		},
		Agents: 6,
	}
	for _, r := range []string{"us", "eu", "ap"} {
		if age, ok := ages[r]; ok {
			s.Exchange.Peers = append(s.Exchange.Peers, adminapi.Peer{Region: r, Heard: age >= 0, ReportAge: age, Stale: age > 5, Policy: "3fa2c1"})
		}
	}
	return s
}

func statusRegions(t *testing.T) (us, eu, ap *fakeRegion) {
	us, eu, ap = newRegion(t), newRegion(t), newRegion(t)
	us.status = status("us", map[string]float64{"eu": 0.4, "ap": 1.2})
	eu.status = status("eu", map[string]float64{"us": 0.3, "ap": 9.8})
	ap.status = status("ap", map[string]float64{"us": -1, "eu": 0.5})
	return us, eu, ap
}

func TestStatusHealthy(t *testing.T) {
	us, eu, ap := statusRegions(t)
	ap.status.Exchange.Holder = false
	out, errOut, code := ration(t, "status", "-admin", admins(us, eu, ap))
	if code != exitOK || errOut != "" {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	golden(t, "status", out, `REGION  REPLICA  READY  STORE     POLICY      HOLDER  EPOCH  KEYS/RESTING  AGENTS  UPTIME  VERSION
us      us-0     yes    redis ok  r12 3fa2c1  yes     3720   42/30         6       1h02m   v0.9.0
eu      eu-0     yes    redis ok  r12 3fa2c1  yes     3720   42/30         6       1h02m   v0.9.0
ap      ap-0     yes    redis ok  r12 3fa2c1  no      3720   42/30         6       1h02m   v0.9.0

peers: report age as each region (row) hears each other (column)
HEARS  us    eu    ap
us     self  0.4s  1.2s
eu     0.3s  self  9.8s*
ap     -     0.5s  self

notes:
  * stale: older than the exchange's limit; the region plans without that peer
  - never heard
`)
}

// TestStatusUnhealthy: a region not ready makes the exit status 1; one
// that cannot be asked, 3; the others are printed either way.
func TestStatusUnhealthy(t *testing.T) {
	us, eu, _ := statusRegions(t)
	eu.status.Ready, eu.status.NotReady = false, "store: dial tcp 10.0.0.5:6379: i/o timeout"
	eu.status.Store = adminapi.Store{Kind: "redis", OK: false, Error: "dial tcp 10.0.0.5:6379: i/o timeout"}
	eu.status.Policy.Revision, eu.status.Policy.Version = 11, "77be01"
	eu.status.Exchange.Disagreements = []string{"per-ip"}
	out, errOut, code := ration(t, "status", "-admin", admins(us, eu))
	if code != exitRefused || errOut != "" {
		t.Fatalf("exit %d, want %d; stderr %s", code, exitRefused, errOut)
	}
	golden(t, "status", out, `REGION  REPLICA  READY  STORE          POLICY      HOLDER  EPOCH  KEYS/RESTING  AGENTS  UPTIME  VERSION
us      us-0     yes    redis ok       r12 3fa2c1  yes     3720   42/30         6       1h02m   v0.9.0
eu      eu-0     no     redis failing  r11 77be01  yes     3720   42/30         6       1h02m   v0.9.0

peers: report age as each region (row) hears each other (column)
HEARS  us    eu    ap
us     self  0.4s  1.2s
eu     0.3s  self  9.8s*

notes:
  eu: store: dial tcp 10.0.0.5:6379: i/o timeout
  eu: not ready: store: dial tcp 10.0.0.5:6379: i/o timeout
  eu: holds the shares of per-ip (a peer defines them otherwise)
  the regions enforce different policy revisions: r12 3fa2c1, r11 77be01
  * stale: older than the exchange's limit; the region plans without that peer
`)

	down := downAddr(t)
	out, errOut, code = ration(t, "status", "-admin", admins(us, eu)+","+down)
	if code != exitUnreachable || !strings.HasPrefix(out, "REGION") || !strings.Contains(errOut, "ration: "+down+": dial tcp") {
		t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, exitUnreachable, out, errOut)
	}

	// -o json: every answer as it came, the errors by address.
	out, _, code = ration(t, "status", "-admin", admins(us, eu)+","+down, "-o", "json")
	var got statusJSON
	decode(t, out, &got)
	want := statusJSON{Regions: []statusRegionJSON{{Admin: us.addr(), Status: us.status}, {Admin: eu.addr(), Status: eu.status}},
		Errors: map[string]string{down: got.Errors[down]}, Exit: exitUnreachable}
	if d := cmp.Diff(want, got); d != "" || code != exitUnreachable || !strings.Contains(got.Errors[down], "connection refused") {
		t.Errorf("exit %d, -o json (-want +got):\n%s", code, d)
	}

	// Every region down: nothing on stdout.
	out, errOut, code = ration(t, "status", "-admin", down)
	if code != exitUnreachable || out != "" || !strings.Contains(errOut, "connection refused") {
		t.Errorf("all down: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestStatusSingleRegion: no exchange, no peers matrix.
func TestStatusSingleRegion(t *testing.T) {
	r := newRegion(t)
	r.status = adminapi.Status{Region: "local", Replica: "local-0", Ready: true, Uptime: 5, Store: adminapi.Store{Kind: "memory", OK: true},
		Policy: adminapi.Policy{Source: "file", Version: "abc"}}
	out, _, code := ration(t, "status", "-admin", r.addr())
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	golden(t, "status", out, `REGION  REPLICA  READY  STORE      POLICY  HOLDER  EPOCH  KEYS/RESTING  AGENTS  UPTIME  VERSION
local   local-0  yes    memory ok  r0 abc  -       -      -             0       5.0s    -
`)
}

// TestAdminToken: the token of -admin-token-file (or the environment) is
// sent; without it the region's 401 is reported, exit 3.
func TestAdminToken(t *testing.T) {
	r := newRegion(t)
	r.status = status("us", nil)
	r.token = "an-admin-token-of-some-length"
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte(r.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := ration(t, "status", "-admin", r.addr())
	if code != exitUnreachable || !strings.Contains(errOut, "401 Unauthorized: unauthorized (the admin token: -admin-token-file)") {
		t.Errorf("without the token: exit %d, stderr %s", code, errOut)
	}
	if _, errOut, code := ration(t, "status", "-admin", r.addr(), "-admin-token-file", tok); code != exitOK {
		t.Errorf("with -admin-token-file: exit %d, stderr %s", code, errOut)
	}
	t.Setenv(envAdminToken, tok)
	t.Setenv(envAdmin, r.addr())
	if _, errOut, code := ration(t, "status"); code != exitOK {
		t.Errorf("with %s and %s: exit %d, stderr %s", envAdminToken, envAdmin, code, errOut)
	}
	got := r.requests()
	if len(got) != 3 || got[0].auth != "" || got[1].auth != "Bearer "+r.token || got[2].auth != "Bearer "+r.token {
		t.Errorf("requests: %+v", got)
	}
}

// TestAdminHTTPS: https URLs, verified with -admin-ca; a host:port is
// https once -admin-ca is given; without the CA the certificate is
// refused.
func TestAdminHTTPS(t *testing.T) {
	ca := tlstest.NewCA(t, "admin CA")
	r := newTLSRegion(t, ca)
	r.status = status("us", nil)
	caFile := tlstest.Write(t, t.TempDir(), "ca.pem", ca.PEM)
	if _, errOut, code := ration(t, "status", "-admin", r.srv.URL, "-admin-ca", caFile); code != exitOK {
		t.Errorf("https URL with -admin-ca: exit %d, stderr %s", code, errOut)
	}
	hostPort := strings.TrimPrefix(r.srv.URL, "https://")
	if _, errOut, code := ration(t, "status", "-admin", hostPort, "-admin-ca", caFile); code != exitOK {
		t.Errorf("host:port with -admin-ca: exit %d, stderr %s", code, errOut)
	}
	_, errOut, code := ration(t, "status", "-admin", r.srv.URL)
	if code != exitUnreachable || !strings.Contains(errOut, "certificate") {
		t.Errorf("without -admin-ca: exit %d, stderr %s", code, errOut)
	}
	other := tlstest.Write(t, t.TempDir(), "other.pem", tlstest.NewCA(t, "other CA").PEM)
	_, errOut, code = ration(t, "status", "-admin", r.srv.URL, "-admin-ca", other)
	if code != exitUnreachable || !strings.Contains(errOut, "certificate") {
		t.Errorf("with another CA: exit %d, stderr %s", code, errOut)
	}
}

// TestAdminMutualTLS: a listener that verifies clients gets -admin-cert;
// without it the handshake fails; -admin-server-name names the server.
func TestAdminMutualTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "admin CA")
	r := newTLSRegion(t, ca)
	r.status = status("us", nil)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	r.srv.TLS.ClientAuth, r.srv.TLS.ClientCAs = tls.RequireAndVerifyClientCert, pool
	dir := t.TempDir()
	caFile := tlstest.Write(t, dir, "ca.pem", ca.PEM)
	certPEM, keyPEM := ca.Issue(t, tlstest.Leaf{Name: "operator", Client: true})
	cert, key := tlstest.Write(t, dir, "cert.pem", certPEM), tlstest.Write(t, dir, "key.pem", keyPEM)
	if _, errOut, code := ration(t, "status", "-admin", r.srv.URL, "-admin-ca", caFile, "-admin-cert", cert, "-admin-key", key); code != exitOK {
		t.Errorf("with -admin-cert: exit %d, stderr %s", code, errOut)
	}
	if _, errOut, code := ration(t, "status", "-admin", r.srv.URL, "-admin-ca", caFile); code != exitUnreachable {
		t.Errorf("without -admin-cert: exit %d, stderr %s", code, errOut)
	}
	_, errOut, code := ration(t, "status", "-admin", r.srv.URL, "-admin-ca", caFile, "-admin-cert", cert, "-admin-key", key, "-admin-server-name", "regiond.example")
	if code != exitUnreachable || !strings.Contains(errOut, "regiond.example") {
		t.Errorf("-admin-server-name the certificate lacks: exit %d, stderr %s", code, errOut)
	}
	if _, errOut, code := ration(t, "status", "-admin", r.srv.URL, "-admin-cert", cert); code != exitUsage {
		t.Errorf("-admin-cert without -admin-key: exit %d, stderr %s", code, errOut)
	}
}

// TestAdminBadAnswers: an answer that is not the admin API's JSON, or too
// large, is refused with a clear error; the others are still printed.
func TestAdminBadAnswers(t *testing.T) {
	good := newRegion(t)
	good.status = status("us", nil)
	for _, tc := range []struct {
		name, raw, rawType, want string
	}{
		{"html", "<html><body>Welcome to nginx!</body></html>", "text/html",
			`the answer is not the admin API's JSON (Content-Type "text/html", "<html><body>Welcome to nginx!</body></html>"): invalid character '<'`},
		{"oversized", `{"region":"us","version":"` + strings.Repeat("x", maxAnswer) + `"}`, "application/json",
			"the answer is not the admin API's JSON: larger than 4194304 bytes (4 MiB); is -admin regiond's admin listener?"},
		{"no region", `{"ready":true}`, "application/json", "the answer is not the admin API's JSON: it names no region"},
		{"array", `[1,2]`, "application/json", `the answer is not the admin API's JSON (Content-Type "application/json", "[1,2]"): json: cannot unmarshal array`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := newRegion(t)
			bad.raw, bad.rawType = tc.raw, tc.rawType
			out, errOut, code := ration(t, "status", "-admin", admins(good, bad))
			if code != exitUnreachable || !strings.HasPrefix(out, "REGION") || !strings.Contains(errOut, "ration: "+bad.addr()+": "+tc.want) {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, exitUnreachable, out, errOut)
			}
		})
	}
}

// TestAdminTimeout: a region that does not answer within -timeout is
// reported; the command does not wait longer.
func TestAdminTimeout(t *testing.T) {
	good := newRegion(t)
	good.status = status("us", nil)
	release := make(chan struct{})
	stuck := newHandlerRegion(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer close(release)
	out, errOut, code := ration(t, "status", "-admin", good.addr()+","+stuck, "-timeout", "2s")
	if code != exitUnreachable || !strings.HasPrefix(out, "REGION") || !strings.Contains(errOut, stuck+": no answer within -timeout") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// newHandlerRegion serves h; it returns its host:port.
func newHandlerRegion(t *testing.T, h http.Handler) string {
	srv := newRegion(t).srv
	srv.Config.Handler = h
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestAdminNotTheAPI: a 404 that is not the admin API's (an older regiond,
// another server) is not "no such key": exit 3, said so.
func TestAdminNotTheAPI(t *testing.T) {
	other := newHandlerRegion(t, http.NotFoundHandler())
	_, errOut, code := ration(t, "inspect", "per-tenant/acme", "-admin", other)
	want := "ration: " + other + `: 404 Not Found: "404 page not found" (not regiond's admin API: a regiond without it, or another server)` + "\n"
	if code != exitUnreachable || errOut != want {
		t.Errorf("exit %d, stderr %q; want %d, %q", code, errOut, exitUnreachable, want)
	}
}
