package main

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/internal/adminapi"
	"github.com/ration-dev/ration/internal/tlsfiles/tlstest"
)

// The client's unit tests: each region is a real HTTP server (httptest)
// that serves the admin API's JSON (internal/adminapi) as a test sets it,
// through the same net/http routing patterns regiond registers, and
// records what it was asked.

// fakeRegion is one region's admin listener.
type fakeRegion struct {
	t     *testing.T
	srv   *httptest.Server
	token string // required when set

	mu     sync.Mutex
	keys   map[string]adminapi.Key
	top    adminapi.Top
	status adminapi.Status
	// raw, when set, is served instead of any JSON (with rawType).
	raw, rawType string
	// asked records each request: its escaped path and query, the store
	// key the mux extracted, the Authorization header.
	asked []asked
}

type asked struct {
	path, query, storeKey, auth string
}

func newRegion(t *testing.T) *fakeRegion {
	f := &fakeRegion{t: t, keys: map[string]adminapi.Key{}}
	f.srv = httptest.NewServer(f.mux())
	t.Cleanup(f.srv.Close)
	return f
}

// newTLSRegion serves over TLS with a certificate for 127.0.0.1 issued by
// ca.
func newTLSRegion(t *testing.T, ca *tlstest.CA) *fakeRegion {
	f := &fakeRegion{t: t, keys: map[string]adminapi.Key{}}
	f.srv = httptest.NewUnstartedServer(f.mux())
	certPEM, keyPEM := ca.Issue(t, tlstest.Leaf{Name: "regiond", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	// The handshakes refused on purpose are not news.
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

// addr is the region's host:port.
func (f *fakeRegion) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

func (f *fakeRegion) mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+adminapi.PathKey+"{storekey}", func(w http.ResponseWriter, r *http.Request) {
		sk := r.PathValue("storekey")
		f.serve(w, r, sk, func() (any, bool) {
			k, ok := f.keys[sk]
			return k, ok
		})
	})
	mux.HandleFunc("GET "+adminapi.PathTop, func(w http.ResponseWriter, r *http.Request) {
		f.serve(w, r, "", func() (any, bool) { return f.top, true })
	})
	mux.HandleFunc("GET "+adminapi.PathStatus, func(w http.ResponseWriter, r *http.Request) {
		f.serve(w, r, "", func() (any, bool) { return f.status, true })
	})
	return mux
}

func (f *fakeRegion) serve(w http.ResponseWriter, r *http.Request, sk string, get func() (any, bool)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, asked{path: r.URL.EscapedPath(), query: r.URL.RawQuery, storeKey: sk, auth: r.Header.Get("Authorization")})
	if f.token != "" && r.Header.Get("Authorization") != "Bearer "+f.token {
		writeAnswer(w, http.StatusUnauthorized, adminapi.Error{Error: "unauthorized"})
		return
	}
	if f.raw != "" {
		w.Header().Set("Content-Type", f.rawType)
		_, _ = w.Write([]byte(f.raw))
		return
	}
	v, ok := get()
	if !ok {
		writeAnswer(w, http.StatusNotFound, adminapi.Error{Error: "no rule named " + strings.Split(sk, "/")[0]})
		return
	}
	writeAnswer(w, http.StatusOK, v)
}

func writeAnswer(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeRegion) requests() []asked {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]asked(nil), f.asked...)
}

// downAddr is a loopback host:port no server listens on.
func downAddr(t *testing.T) string {
	return strings.TrimPrefix(closedURL(t), "nats://")
}

func admins(fs ...*fakeRegion) string {
	var as []string
	for _, f := range fs {
		as = append(as, f.addr())
	}
	return strings.Join(as, ",")
}

// decode decodes the one JSON document of out into v.
func decode(t *testing.T, out string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decoding %s: %v", out, err)
	}
	if dec.More() {
		t.Fatalf("more than one JSON document:\n%s", out)
	}
}

// golden compares an output with its expected text.
func golden(t *testing.T, what, got, want string) {
	t.Helper()
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("%s (-want +got):\n%s\ngot:\n%s", what, d, got)
	}
}

func TestAdminTargets(t *testing.T) {
	for _, tc := range []struct {
		list string
		tls  bool
		want []string
	}{
		{"127.0.0.1:7071", false, []string{"http://127.0.0.1:7071"}},
		{"127.0.0.1:7071", true, []string{"https://127.0.0.1:7071"}},
		{" us.example:7071 , https://eu.example:8443/ration/ ", false, []string{"http://us.example:7071", "https://eu.example:8443/ration"}},
		{"[::1]:7071,http://[::1]:7072", false, []string{"http://[::1]:7071", "http://[::1]:7072"}},
	} {
		ts, err := parseTargets(tc.list, tc.tls)
		if err != nil {
			t.Errorf("%q: %v", tc.list, err)
			continue
		}
		var got []string
		for _, t := range ts {
			got = append(got, t.base.String())
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%q (-want +got):\n%s", tc.list, d)
		}
	}
	for _, bad := range []string{"", "a:1,,b:2", "a:1,a:1", "nohost", "ftp://a:1", "http://", "http://u@a:1", "http://a:1/?x=1"} {
		if _, err := parseTargets(bad, false); err == nil {
			t.Errorf("%q: got nil, want an error", bad)
		}
	}
}

func TestAdminUsage(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"inspect"}, "usage: ration inspect RULE/KEY"},
		{[]string{"inspect", "acme"}, `KEY "acme": want RULE/KEY`},
		{[]string{"inspect", "/acme"}, "want RULE/KEY"},
		{[]string{"inspect", "-rule", "a/b", "acme"}, "a rule's name has no slash"},
		{[]string{"top", "-by", "allowed"}, "-by must be denied or demand"},
		{[]string{"top", "-n", "0"}, "-n must be 1 to 1000"},
		{[]string{"top", "extra"}, "usage: ration top"},
		{[]string{"status", "-admin", "a:1,,b:2"}, "an empty address"},
		{[]string{"status", "-admin", "ftp://a:1"}, "the scheme must be http or https"},
		{[]string{"status", "-nats", "nats://x:4222"}, "flag provided but not defined: -nats"},
		{[]string{"-nats", "nats://x:4222", "status"}, "-nats does not apply to ration status"},
		{[]string{"-admin", "a:1", "policy", "show"}, "-admin does not apply to ration policy show"},
		{[]string{"status", "-admin-token-file", "/does/not/exist"}, "no such file"},
		{[]string{"status", "-admin-ca", "/does/not/exist"}, "CA"},
		{[]string{"status", "-o", "yaml"}, "-o must be text or json"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, errOut, code := ration(t, tc.args...)
			if code != exitUsage {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, exitUsage, out, errOut)
			}
			contains(t, "stderr", errOut, tc.stderr)
		})
	}
	out, _, code := ration(t, "help")
	if code != exitOK {
		t.Fatalf("help: exit %d", code)
	}
	contains(t, "usage", out, "inspect RULE/KEY", "top [-rule RULE]", "status", "-admin-token-file", "RATION_ADMIN", "or (status)")
	out, _, _ = ration(t, "inspect", "-h")
	contains(t, "inspect -h", out, "Usage: ration inspect", "-rule", "-admin-ca", "(default 5s)")
	out, _, _ = ration(t, "policy", "show", "-h")
	if strings.Contains(out, "-admin") {
		t.Errorf("policy show -h lists the admin flags:\n%s", out)
	}
}

func TestSeconds(t *testing.T) {
	for in, want := range map[float64]string{
		-1: "never", 0: "0.0s", 0.84: "0.8s", 9.94: "9.9s", 10: "10s", 59.6: "1m", 60: "1m", 125: "2m05s", 3725: "1h02m", 86400: "24h00m",
	} {
		if got := seconds(in); got != want {
			t.Errorf("seconds(%v) = %q, want %q", in, got, want)
		}
	}
}
