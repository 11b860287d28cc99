package regiond

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/adminapi"
	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/lease"
	leasev1 "github.com/ration-dev/ration/lease/v1"
)

const adminTokenValue = "an-admin-token-of-some-length"

// adminPolicy refills slowly, so that what a test reads of a bucket does
// not depend on how long it took to ask.
const adminPolicy = `
rules:
  - name: per-tenant
    key: [tenant]
    limit: 3600
    period: 1h
    burst: 2000
  - name: per-ip
    key: [ip]
    limit: 100
    period: 1h
    scope: region
`

// adminGet calls the admin API of d with token ("" none) and decodes a 200
// answer into out (an adminapi.Error otherwise, which it returns).
func adminGet(t *testing.T, d *Daemon, token, path string, out any) (int, adminapi.Error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+d.AdminAddr()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
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
	var e adminapi.Error
	if resp.StatusCode != http.StatusOK {
		if err := json.Unmarshal(body, &e); err != nil || e.Error == "" {
			t.Errorf("GET %s: %d with body %q, want an adminapi.Error", path, resp.StatusCode, body)
		}
		return resp.StatusCode, e
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET %s: Content-Type %q", path, ct)
	}
	if err := json.Unmarshal(body, out); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, body)
	}
	return resp.StatusCode, e
}

func keyPath(storeKey string) string { return adminapi.PathKey + url.PathEscape(storeKey) }

func leaseItems(t *testing.T, c leasev1.LeaseServiceClient, items ...*leasev1.LeaseItem) *leasev1.LeaseResponse {
	t.Helper()
	resp, err := c.Lease(context.Background(), &leasev1.LeaseRequest{Agent: &leasev1.Agent{Id: "test-agent"}, Items: items})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestAdminAPI: one region on a memory store with an admin token; agents
// report demand for two tenants, one of them mostly denied; the key, top
// and status endpoints answer what the store and the summary hold, bad
// requests get their codes, and the rule-labelled metrics count it.
func TestAdminAPI(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(adminTokenValue+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, Config{Region: "eu", Replica: "eu-0", AdminTokenFile: tokenFile, PolicyYAML: []byte(adminPolicy)})
	c := client(t, d)
	// acme's agent asked for 500 tokens since its last report and admitted
	// 100 itself; 100 of the rest wait for this call, which grants them: 300
	// were denied (service.noteItem).
	leaseItems(t, c,
		&leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 100, Demand: 500, Admitted: 100},
		&leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=globex", Want: 50, Demand: 50, Admitted: 50},
	)
	// per-ip holds 100 a region: the second ask finds the bucket dry, and
	// the service remembers it so.
	leaseItems(t, c, &leasev1.LeaseItem{Rule: "per-ip", Key: "ip=10.0.0.1", Want: 100, Demand: 100, Admitted: 100})
	if g := leaseItems(t, c, &leasev1.LeaseItem{Rule: "per-ip", Key: "ip=10.0.0.1", Want: 100, Demand: 30}).GetGrants()[0].GetGranted(); g != 0 {
		t.Fatalf("second per-ip ask: granted %d, want 0", g)
	}

	var k adminapi.Key
	if code, e := adminGet(t, d, adminTokenValue, keyPath("per-tenant/tenant=acme"), &k); code != 200 {
		t.Fatalf("key: %d %v", code, e)
	}
	if k.Region != "eu" || k.Replica != "eu-0" || k.Rule != "per-tenant" || k.Key != "tenant=acme" || k.Scope != "global" ||
		k.Algorithm != "token_bucket" || k.Limit != 3600 || k.Period != 3600 {
		t.Errorf("key: got %+v", k)
	}
	if b := k.Bucket; b == nil || b.Tokens < 1900 || b.Tokens > 1910 || b.Capacity != 2000 || b.Rate != 1 || b.Share != 1 {
		t.Errorf("bucket: got %+v, want about 1,900 of 2,000 tokens at 1/s, share 1", b)
	}
	if k.Exchange != nil || !strings.Contains(k.Note, "no exchange") {
		t.Errorf("exchange of a single region: got %+v, note %q", k.Exchange, k.Note)
	}
	if r := k.Recent; !r.Tracked || r.Denied < 300 || r.Admitted < 100 || r.Window <= 0 {
		t.Errorf("recent: got %+v, want 300 denied and 100 admitted, tracked", r)
	}

	var plain adminapi.Key // the slash left unescaped
	if code, e := adminGet(t, d, adminTokenValue, adminapi.PathKey+"per-tenant/tenant=acme", &plain); code != 200 || plain.StoreKey != k.StoreKey {
		t.Errorf("key with its slash unescaped: %d %v, store key %q", code, e, plain.StoreKey)
	}

	var dry adminapi.Key
	adminGet(t, d, adminTokenValue, keyPath("per-ip/ip=10.0.0.1"), &dry)
	if dry.Scope != "region" || dry.DryFor <= 0 || dry.Bucket == nil || dry.Bucket.Tokens >= 1 || dry.Exchange != nil {
		t.Errorf("a dry region key: got %+v (bucket %+v), want it remembered dry with an empty bucket", dry, dry.Bucket)
	}
	var fresh adminapi.Key
	adminGet(t, d, adminTokenValue, keyPath("per-tenant/tenant=never"), &fresh)
	if fresh.Bucket != nil || fresh.Recent.Tracked || !strings.Contains(fresh.Note, "no bucket") {
		t.Errorf("a key never leased: got %+v", fresh)
	}

	var top adminapi.Top
	adminGet(t, d, adminTokenValue, adminapi.PathTop+"?by=denied&rule=per-tenant", &top)
	if top.By != "denied" || top.Rule != "per-tenant" || len(top.Keys) != 1 || top.Keys[0].StoreKey != "per-tenant/tenant=acme" ||
		top.Keys[0].Key != "tenant=acme" || top.Keys[0].Count < 300 || top.Window <= 0 {
		t.Errorf("top by denied: got %+v, want acme alone", top)
	}
	adminGet(t, d, adminTokenValue, adminapi.PathTop+"?by=demand&n=2", &top)
	if len(top.Keys) != 2 || top.Keys[0].StoreKey != "per-tenant/tenant=acme" || top.Keys[1].StoreKey != "per-ip/ip=10.0.0.1" {
		t.Errorf("top 2 by demand: got %+v, want acme (400) then the ip (130)", top.Keys)
	}

	var st adminapi.Status
	adminGet(t, d, adminTokenValue, adminapi.PathStatus, &st)
	if !st.Ready || st.NotReady != "" || st.Store != (adminapi.Store{Kind: "memory", OK: true}) || st.Policy.Rules != 2 ||
		st.Policy.Source != "in-process" || st.Policy.Version == "" || st.Exchange != nil || st.Agents != 1 || st.Uptime <= 0 {
		t.Errorf("status: got %+v", st)
	}

	for _, tc := range []struct {
		token, path string
		code        int
	}{
		{"", keyPath("per-tenant/tenant=acme"), 401},
		{"wrong-token-wrong-token", adminapi.PathStatus, 401},
		{"", adminapi.PathTop, 401},
		{adminTokenValue, keyPath("no-such-rule/tenant=acme"), 404},
		{adminTokenValue, keyPath("per-tenant"), 400},
		{adminTokenValue, keyPath("per-tenant/"), 400},
		{adminTokenValue, adminapi.PathKey, 400},
		{adminTokenValue, adminapi.PathTop + "?by=volume", 400},
		{adminTokenValue, adminapi.PathTop + "?n=0", 400},
		{adminTokenValue, adminapi.PathTop + "?rule=no-such-rule", 404},
	} {
		if code, _ := adminGet(t, d, tc.token, tc.path, &struct{}{}); code != tc.code {
			t.Errorf("GET %s with token %q: got %d, want %d", tc.path, tc.token, code, tc.code)
		}
	}

	for _, m := range []struct {
		name  string
		pairs []string
		want  float64
	}{
		{"ration_lease_denied_tokens_total", []string{"rule", "per-tenant", "source", "agent"}, 300},
		{"ration_lease_denied_tokens_total", []string{"rule", "per-ip", "source", "agent"}, 30},
		{"ration_lease_denied_tokens_total", []string{"rule", "per-ip", "source", "region"}, 100},
		{"ration_policy_rule_limit", []string{"rule", "per-tenant"}, 1},
		{"ration_policy_rule_limit", []string{"rule", "per-ip"}, 100.0 / 3600},
		{"ration_admin_requests_total", []string{"path", "/v1/keys/{storekey...}", "code", "404"}, 1},
		{"ration_admin_requests_total", []string{"path", "/v1/keys/{storekey...}", "code", "401"}, 1},
		{"ration_admin_requests_total", []string{"path", "/v1/top", "code", "200"}, 2},
	} {
		if got := metricSum(t, d, m.name, m.pairs...); got != m.want {
			t.Errorf("%s%v: got %v, want %v", m.name, m.pairs, got, m.want)
		}
	}
	if got := histogramCount(t, d, "ration_lease_granted_tokens", "per-tenant"); got != 2 {
		t.Errorf("ration_lease_granted_tokens{rule=per-tenant} count: got %d, want 2", got)
	}
}

func histogramCount(t *testing.T, d *Daemon, name, rule string) uint64 {
	t.Helper()
	mfs, err := d.cfg.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "rule" && l.GetValue() == rule {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// TestReadyzWaitsForPeers: a region of two is not ready until it hears the
// other (its grace is long), then is; the status and a key's view show the
// peer, and the peer lag is scraped.
func TestReadyzWaitsForPeers(t *testing.T) {
	regions := []string{"eu", "us"}
	eu := startDaemon(t, Config{Region: "eu", Regions: regions, NATSEmbedded: true, NATSListen: "127.0.0.1:0", SyncPeriod: syncPeriod,
		ReadyGrace: time.Hour})
	admin := "http://" + eu.AdminAddr()
	if code, body := get(t, admin+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "us") {
		t.Fatalf("/readyz before us reported: got %d %q, want 503 naming us", code, body)
	}
	var st adminapi.Status
	adminGet(t, eu, "", adminapi.PathStatus, &st)
	if st.Ready || !strings.Contains(st.NotReady, "us") {
		t.Errorf("status before us reported: got ready %v %q", st.Ready, st.NotReady)
	}

	us := startDaemon(t, Config{Region: "us", Regions: regions, NATSURL: eu.NATSURL(), SyncPeriod: syncPeriod, ReadyGrace: time.Hour})
	for _, d := range []*Daemon{eu, us} {
		waitFor(t, func() bool { code, _ := get(t, "http://"+d.AdminAddr()+"/readyz"); return code == http.StatusOK })
	}
	leaseItems(t, client(t, us), &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 10, Demand: 10, Admitted: 10})

	waitFor(t, func() bool {
		adminGet(t, eu, "", adminapi.PathStatus, &st)
		return st.Exchange != nil && st.Exchange.Holder && len(st.Exchange.Peers) == 1 && st.Exchange.Peers[0].Heard
	})
	if p := st.Exchange.Peers[0]; p.Region != "us" || p.ReportAge < 0 || p.Stale || p.Policy == "" || st.Exchange.Period != syncPeriod.Seconds() {
		t.Errorf("eu's status of us: got %+v (exchange %+v)", p, st.Exchange)
	}
	var k adminapi.Key
	waitFor(t, func() bool {
		adminGet(t, us, "", keyPath("per-tenant/tenant=acme"), &k)
		return k.Exchange != nil && len(k.Exchange.Regions) == 2 && k.Exchange.Regions[1].Demand > 0
	})
	if eu, us := k.Exchange.Regions[0], k.Exchange.Regions[1]; eu.Region != "eu" || eu.Self || eu.ReportAge < 0 || !us.Self || us.Share <= 0 {
		t.Errorf("us's view of the key: got %+v", k.Exchange.Regions)
	}
	if got := metricSum(t, eu, "ration_exchange_peer_lag_seconds", "region", "us"); got < 0 || got > 10 {
		t.Errorf("eu's lag of us: got %v s", got)
	}
}

// TestReadyGraceAlone: a region whose peer never comes is not ready at
// first, and ready once its grace has passed.
func TestReadyGraceAlone(t *testing.T) {
	eu := startDaemon(t, Config{Region: "eu", Regions: []string{"eu", "us"}, NATSEmbedded: true, NATSListen: "127.0.0.1:0",
		SyncPeriod: syncPeriod, ReadyGrace: 3 * time.Second})
	admin := "http://" + eu.AdminAddr() + "/readyz"
	if code, body := get(t, admin); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz at start: got %d %q, want 503", code, body)
	}
	waitFor(t, func() bool { code, _ := get(t, admin); return code == http.StatusOK })
	// The exchange started a little after the daemon.
	if got := metricSum(t, eu, "ration_exchange_peer_lag_seconds", "region", "us"); got < 2.5 {
		t.Errorf("lag of a region never heard: got %v s, want the time since the exchange started (about 3s)", got)
	}
}

// TestAdminKeyOnRedis: the key endpoint reads a bucket from a real
// redis-server as the lease API left it, in either layout.
func TestAdminKeyOnRedis(t *testing.T) {
	for _, layout := range []lease.RedisLayout{lease.LayoutKeys, lease.LayoutGroups} {
		t.Run(layout.String(), func(t *testing.T) { adminKeyOnRedis(t, layout) })
	}
}

func adminKeyOnRedis(t *testing.T, layout lease.RedisLayout) {
	d := startDaemon(t, Config{RedisURL: redistest.StartServer(t).URL(), RedisLayout: layout, PolicyYAML: []byte(adminPolicy), StoreTimeout: time.Second})
	c := client(t, d)
	// acme's agent asked for 500 tokens since its last report and admitted
	// 100 itself; 100 of the rest wait for this call, which grants them: 300
	// were denied (service.noteItem).
	leaseItems(t, c, &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 100, Demand: 100, Admitted: 100})
	var k adminapi.Key
	if code, e := adminGet(t, d, "", keyPath("per-tenant/tenant=acme"), &k); code != 200 {
		t.Fatalf("key: %d %v", code, e)
	}
	if b := k.Bucket; b == nil || b.Tokens < 1900 || b.Tokens > 1910 || b.Capacity != 2000 || b.Share != 1 {
		t.Errorf("bucket in Redis: got %+v, want about 1,900 of 2,000 tokens", b)
	}
	var none adminapi.Key
	adminGet(t, d, "", keyPath("per-tenant/tenant=none"), &none)
	if none.Bucket != nil {
		t.Errorf("a key never leased: got bucket %+v", none.Bucket)
	}
	var st adminapi.Status
	adminGet(t, d, "", adminapi.PathStatus, &st)
	if st.Store != (adminapi.Store{Kind: "redis", OK: true}) || !st.Ready {
		t.Errorf("status on Redis: got %+v", st)
	}
}
