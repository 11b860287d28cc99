package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/internal/regiond"
	"github.com/ration-dev/ration/policy/kvstore"
	"github.com/ration-dev/ration/sync/embedded"
)

// TestThreeRegionsOneStore is the policy store end to end: three regiond,
// each on its own real redis-server, on one embedded NATS with JetStream,
// all following nats-kv://ration-policy. A `ration policy push` is applied
// by every region within 2 s; a bad file is refused by the CLI and writes
// nothing; a bad revision put straight into the bucket is refused by every
// regiond, which keep the policy they had; `rollback` restores the earlier
// revision everywhere; `history` shows author, time, message and diff.
func TestThreeRegionsOneStore(t *testing.T) {
	ns, err := embedded.Start(embedded.Config{JetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	url := ns.ClientURL()
	regions := []string{"ap", "eu", "us"}
	var ds []*regiond.Daemon
	regs := map[*regiond.Daemon]*prometheus.Registry{}
	for _, r := range regions {
		reg := prometheus.NewRegistry()
		d := startRegion(t, regiond.Config{
			Registry: reg, Region: r, Regions: regions, NATSURL: url, PolicyFile: "nats-kv://ration-policy",
		})
		ds = append(ds, d)
		regs[d] = reg
	}
	dir := t.TempDir()
	write := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cli := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(append(args, "-nats", url), &out, &errOut)
		return code, out.String() + errOut.String()
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx := context.Background()
	current := func() uint64 {
		st, err := kvstore.Open(ctx, kvstore.Config{Conn: nc, NoCreate: true})
		if err != nil {
			t.Fatal(err)
		}
		r, err := st.Current(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return r.Revision
	}
	// everywhere waits until every region applied rev, and returns how long
	// that took.
	everywhere := func(what string, rev uint64, start time.Time) time.Duration {
		t.Helper()
		deadline := start.Add(10 * time.Second)
		for {
			all := true
			for _, d := range ds {
				all = all && d.PolicyRevision() == rev
			}
			if all {
				return time.Since(start)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: revision %d not applied everywhere within 10s", what, rev)
			}
			time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
		}
	}
	limit := func(d *regiond.Daemon) int64 { return d.Service().Policy().Rule("per-tenant").Limit }
	doc := func(limit int) string {
		return "rules:\n  - {name: per-tenant, key: [tenant], limit: " + strconv.Itoa(limit) + ", period: 1s, burst: " + strconv.Itoa(2*limit) + "}\n"
	}

	start := time.Now()
	if code, out := cli("policy", "push", write("a.yaml", doc(1000)), "-m", "first", "-author", "alice"); code != 0 {
		t.Fatalf("push: exit %d\n%s", code, out)
	}
	r1 := current()
	// regiond was waiting for the bucket's first revision (it looks every second).
	if took := everywhere("the first push", r1, start); took > 2*time.Second {
		t.Errorf("the first push took %v to reach every region, want within 2s", took)
	}

	start = time.Now()
	if code, out := cli("policy", "push", write("b.yaml", doc(2000)), "-m", "raise per-tenant", "-author", "bob"); code != 0 {
		t.Fatalf("push: exit %d\n%s", code, out)
	}
	r2 := current()
	took := everywhere("a push", r2, start)
	t.Logf("revision %d applied by all three regions %v after the push began", r2, took)
	if took > 2*time.Second {
		t.Errorf("a push took %v to reach every region, want within 2s", took)
	}
	for _, d := range ds {
		if limit(d) != 2000 {
			t.Fatalf("limit %d after the push, want 2000", limit(d))
		}
	}

	// A bad file: refused by the CLI, nothing written.
	if code, out := cli("policy", "push", write("bad.yaml", "rules:\n  - {name: per-tenant, key: [tenant], limit: 0}\n"), "-m", "oops"); code != 1 || !strings.Contains(out, "limit") {
		t.Fatalf("push of a bad file: exit %d, want 1 and the problem named\n%s", code, out)
	}
	if current() != r2 {
		t.Fatal("a refused push wrote a revision")
	}

	// A bad revision put straight into the bucket: every regiond refuses it.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, kvstore.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, kvstore.KeyEnforced, []byte("rules: [{name: per-tenant, limit: lots}]\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, d := range ds {
		for refused(t, regs[d]) < 1 {
			if time.Now().After(deadline) {
				t.Fatal("a regiond did not refuse the bad revision within 10s")
			}
			time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
		}
		if d.PolicyRevision() != r2 || limit(d) != 2000 {
			t.Fatalf("after the bad revision: revision %d, limit %d; want %d and 2000 kept", d.PolicyRevision(), limit(d), r2)
		}
	}

	// Rollback to the first revision: everywhere.
	start = time.Now()
	if code, out := cli("policy", "rollback", strconv.FormatUint(r1, 10), "-m", "back to the first", "-author", "alice"); code != 0 {
		t.Fatalf("rollback: exit %d\n%s", code, out)
	}
	r4 := current()
	took = everywhere("the rollback", r4, start)
	t.Logf("rollback to revision %d as revision %d applied everywhere in %v", r1, r4, took)
	for _, d := range ds {
		if limit(d) != 1000 {
			t.Fatalf("limit %d after the rollback, want 1000", limit(d))
		}
	}

	code, out := cli("policy", "history", "-v")
	if code != 0 {
		t.Fatalf("history: exit %d\n%s", code, out)
	}
	for _, want := range []string{"alice", "bob", "raise per-tenant", "back to the first", "-  - {name: per-tenant, key: [tenant], limit: 1000", time.Now().UTC().Format("2006-01-02")} {
		if !strings.Contains(out, want) {
			t.Errorf("history lacks %q:\n%s", want, out)
		}
	}
}

// refused reads ration_policy_refused_total from a daemon's registry.
func refused(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "ration_policy_refused_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// startRegion starts a regiond of cfg's region on loopback, on a real
// redis-server of its own, with the tests' timings, quiet, and shuts it
// down when the test ends.
func startRegion(t *testing.T, cfg regiond.Config) *regiond.Daemon {
	t.Helper()
	cfg.Replica, cfg.Listen, cfg.Admin = cfg.Region+"-0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.RedisURL = redistest.StartServer(t).URL()
	cfg.SyncPeriod, cfg.StoreTimeout, cfg.NATSReconnectWait = 500*time.Millisecond, time.Second, 20*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := regiond.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Shutdown(ctx)
	})
	return d
}
