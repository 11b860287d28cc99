package regiond

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	leasev1 "github.com/ration-dev/ration/lease/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-redis keeps a pool reaper per client until Close; the daemon
		// closes its client, but the reaper exits asynchronously.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"))
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startDaemon starts a daemon on free loopback ports and stops it at cleanup.
func startDaemon(t *testing.T, cfg Config) *Daemon {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admin = "127.0.0.1:0"
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return d
}

func client(t *testing.T, d *Daemon) leasev1.LeaseServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(d.LeaseAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return leasev1.NewLeaseServiceClient(conn)
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func leaseOne(ctx context.Context, c leasev1.LeaseServiceClient, rule, key string, want int64) (*leasev1.LeaseResponse, error) {
	return c.Lease(ctx, &leasev1.LeaseRequest{
		Agent: &leasev1.Agent{Id: "test-agent"},
		Items: []*leasev1.LeaseItem{{Rule: rule, Key: key, Want: want, Demand: want, Admitted: want}},
	})
}

func TestEmbeddedDefaultsServeLeasesAndAdmin(t *testing.T) {
	d := startDaemon(t, Config{})
	admin := "http://" + d.AdminAddr()
	if code, body := get(t, admin+"/healthz"); code != 200 {
		t.Fatalf("/healthz: got %d %q, want 200", code, body)
	}
	if code, body := get(t, admin+"/readyz"); code != 200 {
		t.Fatalf("/readyz: got %d %q, want 200", code, body)
	}
	c := client(t, d)
	resp, err := leaseOne(context.Background(), c, "per-tenant", "tenant=acme", 100)
	if err != nil {
		t.Fatal(err)
	}
	if g := resp.GetGrants()[0].GetGranted(); g != 100 {
		t.Fatalf("got %d tokens, want 100", g)
	}
	_, body := get(t, admin+"/metrics")
	for _, m := range []string{
		`ration_lease_requests_total{outcome="ok",rpc="lease"} 1`,
		`ration_tokens_granted_total 100`,
		`ration_store_call_duration_seconds_bucket`,
		`ration_lease_items_total{outcome="granted"} 1`,
	} {
		if !strings.Contains(body, m) {
			t.Errorf("/metrics lacks %q", m)
		}
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	// Write to a temporary name and rename, as editors and config
	// management do, so the watcher never reads half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

const policyA = "rules:\n  - name: a\n    key: [tenant]\n    limit: 10\n"
const policyB = "rules:\n  - name: b\n    key: [tenant]\n    limit: 20\n"

func TestPolicyReloadKeepsGoodPolicyOnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, policyA)
	d := startDaemon(t, Config{PolicyFile: path, PolicyInterval: time.Hour})
	c := client(t, d)
	ctx := context.Background()
	if _, err := leaseOne(ctx, c, "a", "tenant=x", 1); err != nil {
		t.Fatalf("rule a: %v", err)
	}

	writeFile(t, path, policyB)
	if err := d.Reload(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return d.Service().Policy().Rule("b") != nil })

	writeFile(t, path, "rules:\n  - name: c\n    key: [tenant]\n    limit: -1\n")
	err := d.Reload()
	if err == nil || !strings.Contains(err.Error(), "policy.yaml:4: rules[0].limit") {
		t.Fatalf("got %v, want an error naming policy.yaml:4 rules[0].limit", err)
	}
	if d.Service().Policy().Rule("b") == nil {
		t.Fatal("a bad file replaced the good policy")
	}
	if got := metricSum(t, d, "ration_policy_refused_total", "source", "file"); got != 1 {
		t.Errorf("ration_policy_refused_total{source=file} = %v after one bad file, want 1", got)
	}
	if _, err := leaseOne(ctx, c, "b", "tenant=x", 1); err != nil {
		t.Fatalf("rule b after a failed reload: %v", err)
	}
}

func TestPolicyFileWatched(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, policyA)
	d := startDaemon(t, Config{PolicyFile: path, PolicyInterval: 10 * time.Millisecond})
	writeFile(t, path, policyB)
	waitFor(t, func() bool { return d.Service().Policy().Rule("b") != nil })
}

// waitFor polls cond until it holds, failing the test after a deadline.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10s")
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not a wait for an event
	}
}

func TestUnknownRuleIsInvalidArgument(t *testing.T) {
	d := startDaemon(t, Config{})
	_, err := leaseOne(context.Background(), client(t, d), "no-such-rule", "k", 1)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v, want InvalidArgument", err)
	}
}
