package httplimit

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/lease/agent/internal/leaseserver"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testPolicy = `
rules:
  - name: per-key
    key: [api_key]
    limit: 3
    period: 1m
  - name: guarded
    match: { route: "GET /guarded" }
    key: [ip]
    limit: 1000
    period: 1s
    on_error: closed
  - name: trial
    match: { route: "GET /trial" }
    key: [ip]
    limit: 1
    period: 1m
    shadow: true
`

// newServer serves a mux behind the middleware, deciding with a real agent
// against a real region.
func newServer(t *testing.T, r *leaseserver.Server) (*httptest.Server, *agent.Agent) {
	t.Helper()
	a := startAgent(t, agent.Config{
		Target: r.Addr, Logger: leaseserver.Quiet(),
		RoundTripTimeout: time.Second, ProbeInterval: 20 * time.Millisecond, BreakerFailures: 1,
	})
	mw, err := New(Config{Agent: a, Extractor: Extractor{APIKeyHeader: "X-API-Key"}, ProblemType: "https://ration.dev/problems/rate-limited"})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	ok := func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }
	mux.HandleFunc("GET /things", ok)
	mux.HandleFunc("GET /guarded", ok)
	mux.HandleFunc("GET /trial", ok)
	// The mux matches first, so that the middleware sees the pattern.
	srv := httptest.NewServer(routeFirst(mux, mw))
	t.Cleanup(srv.Close)
	return srv, a
}

// startAgent starts an agent of cfg, closed at the test's end, once it
// holds the region's policy.
func startAgent(t *testing.T, cfg agent.Config) *agent.Agent {
	t.Helper()
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.WaitPolicy(ctx); err != nil {
		t.Fatal(err)
	}
	return a
}

// routeFirst lets mux match the pattern (setting Request.Pattern) before
// the middleware decides, then serves the matched handler.
func routeFirst(mux *http.ServeMux, mw func(http.Handler) http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		r.Pattern = pattern
		mw(h).ServeHTTP(w, r)
	})
}

func get(t *testing.T, url string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func TestHeadersAnd429ProblemJSON(t *testing.T) {
	r := leaseserver.Start(t, testPolicy, service.Config{LeaseTTL: time.Minute})
	srv, _ := newServer(t, r)

	resp, body := get(t, srv.URL+"/things", "X-API-Key", "k1")
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("first request got %d %q, want 200 ok", resp.StatusCode, body)
	}
	// One token leased and spent, two left in the region: the key's quota
	// of 3 refills a token every 20s, so it is whole again in 20s.
	want := map[string]string{
		"Ratelimit-Policy":      `"per-key";q=3;w=60`,
		"Ratelimit":             `"per-key";r=2;t=20`,
		"X-Ratelimit-Limit":     "3",
		"X-Ratelimit-Remaining": "2",
		"X-Ratelimit-Reset":     "20",
		"Retry-After":           "",
	}
	for h, v := range want {
		if got := resp.Header.Get(h); got != v {
			t.Errorf("header %s got %q, want %q", h, got, v)
		}
	}
	get(t, srv.URL+"/things", "X-API-Key", "k1")
	get(t, srv.URL+"/things", "X-API-Key", "k1")
	resp, body = get(t, srv.URL+"/things", "X-API-Key", "k1")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("4th request got %d, want 429", resp.StatusCode)
	}
	if got := resp.Header.Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("Content-Type got %q, want application/problem+json", got)
	}
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > 20 {
		t.Errorf("Retry-After got %q, want whole seconds in [1, 20]", resp.Header.Get("Retry-After"))
	}
	for h, v := range map[string]string{
		"Ratelimit-Policy":      `"per-key";q=3;w=60`,
		"X-Ratelimit-Limit":     "3",
		"X-Ratelimit-Remaining": "0",
		"X-Ratelimit-Reset":     "60",
		"Ratelimit":             `"per-key";r=0;t=60`,
	} {
		if got := resp.Header.Get(h); got != v {
			t.Errorf("429 header %s got %q, want %q", h, got, v)
		}
	}
	var p Problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	wantP := Problem{
		Type:       "https://ration.dev/problems/rate-limited",
		Title:      "Too Many Requests",
		Status:     429,
		Detail:     `Rate limit "per-key" exceeded: 3 per 1m0s.`,
		Instance:   "/things",
		Rule:       "per-key",
		RetryAfter: int64(retry),
	}
	if diff := cmp.Diff(wantP, p); diff != "" {
		t.Errorf("problem body (-want +got):\n%s", diff)
	}
	// Another key has its own quota.
	if resp, _ := get(t, srv.URL+"/things", "X-API-Key", "k2"); resp.StatusCode != 200 {
		t.Errorf("other key got %d, want 200", resp.StatusCode)
	}
	// No rule matches a request without an API key: no headers.
	resp, _ = get(t, srv.URL+"/things")
	if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
		t.Errorf("unmatched request got %d with RateLimit %q, want 200 and none", resp.StatusCode, resp.Header.Get("RateLimit"))
	}
}

func TestShadowNeverRejects(t *testing.T) {
	r := leaseserver.Start(t, testPolicy, service.Config{LeaseTTL: time.Minute})
	srv, a := newServer(t, r)
	for i := 0; i < 3; i++ {
		resp, _ := get(t, srv.URL+"/trial")
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
			t.Errorf("request %d under a shadow rule got %d with RateLimit %q, want 200 and none", i, resp.StatusCode, resp.Header.Get("RateLimit"))
		}
	}
	if got := a.Stats().Decisions[agent.PathShadow][1]; got != 2 {
		t.Errorf("shadow decisions that would have denied: got %d, want 2", got)
	}
}

func TestFailClosedIs503(t *testing.T) {
	r := leaseserver.Start(t, testPolicy, service.Config{})
	srv, _ := newServer(t, r)
	r.Crash()
	resp, body := get(t, srv.URL+"/guarded")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("fail-closed request got %d, want 503", resp.StatusCode)
	}
	var p Problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if p.Status != 503 || p.Title != "Service Unavailable" || p.Rule != "guarded" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("got %+v with Retry-After %q, want a 503 problem for rule guarded with Retry-After", p, resp.Header.Get("Retry-After"))
	}
}

func TestExtractor(t *testing.T) {
	// The peer and the proxy before it are trusted.
	proxies := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("10.0.0.0/8")}
	r := httptest.NewRequest("GET", "/v1/things/7", nil)
	r.RemoteAddr = "192.0.2.7:5555"
	r.Pattern = "GET /v1/things/{id}"
	r.Header.Set("X-Forwarded-For", "198.51.100.1, 10.0.0.1")
	r.Header.Set("X-API-Key", "secret")
	r.Header.Set("X-User", "ada")
	tests := []struct {
		name string
		e    Extractor
		want []policy.Descriptor
	}{
		{"zero value: pattern, method, peer address", Extractor{}, []policy.Descriptor{
			{Key: "route", Value: "GET /v1/things/{id}"}, {Key: "method", Value: "GET"}, {Key: "ip", Value: "192.0.2.7"},
		}},
		{"forwarded address from a trusted peer, plus headers", Extractor{TrustedProxies: proxies, APIKeyHeader: "X-API-Key", UserHeader: "X-User"}, []policy.Descriptor{
			{Key: "route", Value: "GET /v1/things/{id}"}, {Key: "method", Value: "GET"}, {Key: "ip", Value: "198.51.100.1"},
			{Key: "api_key", Value: "secret"}, {Key: "user", Value: "ada"},
		}},
		{"custom route and extras", Extractor{
			Route: func(*http.Request) string { return "things" },
			Extra: func(r *http.Request, dst []policy.Descriptor) []policy.Descriptor {
				return append(dst, policy.Descriptor{Key: "tenant", Value: "acme"})
			},
		}, []policy.Descriptor{
			{Key: "route", Value: "things"}, {Key: "method", Value: "GET"}, {Key: "ip", Value: "192.0.2.7"}, {Key: "tenant", Value: "acme"},
		}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, tt.e.Descriptors(r, nil)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
	// A forwarded header that is not an address is ignored.
	r.Header.Set("X-Forwarded-For", "nonsense")
	e := Extractor{TrustedProxies: proxies}
	if got := e.Descriptors(r, nil)[2].Value; got != "192.0.2.7" {
		t.Errorf("ip with a bogus X-Forwarded-For got %q, want the peer address", got)
	}
	if _, err := New(Config{}); err != ErrNoAgent {
		t.Errorf("New without an agent got %v, want ErrNoAgent", err)
	}
	if err := (Config{}).Validate(); err != ErrNoAgent {
		t.Errorf("Validate without an agent got %v, want ErrNoAgent", err)
	}
}

// TestClientIPBehindProxies: the client IP is the rightmost forwarded
// address that is not a trusted proxy, so what a client writes on the left
// changes nothing; an untrusted peer's headers are ignored.
func TestClientIPBehindProxies(t *testing.T) {
	e := Extractor{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:f::/48")}}
	for _, tc := range []struct {
		name, peer string
		hdr        map[string][]string
		want       string
	}{
		{"no proxy", "198.51.100.9:1", map[string][]string{"X-Forwarded-For": {"1.2.3.4"}}, "198.51.100.9"},
		{"one proxy", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"198.51.100.1"}}, "198.51.100.1"},
		{"spoofed on the left", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"6.6.6.6, 7.7.7.7, 198.51.100.1"}}, "198.51.100.1"},
		{"two proxies", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"6.6.6.6, 198.51.100.1, 10.1.1.1"}}, "198.51.100.1"},
		{"header lines in order", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"6.6.6.6", "198.51.100.1, 10.2.2.2"}}, "198.51.100.1"},
		{"all proxies", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"10.3.3.3, 10.2.2.2"}}, "10.3.3.3"},
		{"garbage stops the walk", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"198.51.100.1, junk, 10.2.2.2"}}, "10.2.2.2"},
		{"no header", "10.0.0.1:1", nil, "10.0.0.1"},
		{"Forwarded", "10.0.0.1:1", map[string][]string{"Forwarded": {`for=6.6.6.6, for="[2001:db8::7]:4711";proto=https, for=10.9.9.9`}}, "2001:db8::7"},
		{"Forwarded before X-Forwarded-For", "10.0.0.1:1", map[string][]string{"Forwarded": {"for=198.51.100.2"}, "X-Forwarded-For": {"6.6.6.6"}}, "198.51.100.2"},
		{"Forwarded obfuscated", "10.0.0.1:1", map[string][]string{"Forwarded": {"for=6.6.6.6, for=_hidden"}}, "10.0.0.1"},
		{"IPv6 proxy", "[2001:db8:f::1]:443", map[string][]string{"X-Forwarded-For": {"198.51.100.3"}}, "198.51.100.3"},
		{"IPv4-mapped proxy", "[::ffff:10.0.0.1]:443", map[string][]string{"X-Forwarded-For": {"198.51.100.4"}}, "198.51.100.4"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.peer
		for k, vs := range tc.hdr {
			for _, v := range vs {
				r.Header.Add(k, v)
			}
		}
		if got := e.Descriptors(r, nil)[2].Value; got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}
