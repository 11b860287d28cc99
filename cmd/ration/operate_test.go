package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/adminapi"
	"github.com/ration-dev/ration/internal/regiond"
	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/sync/embedded"
)

// operatePolicy has a global per-tenant quota the busy key overruns in one
// region, and a small per-user quota a few abusers overrun tenfold beside
// well-behaved users.
const operatePolicy = `rules:
  - {name: per-tenant, key: [tenant], limit: 1000, period: 1s, burst: 1000}
  - {name: per-user, key: [user], limit: 20, period: 1s, burst: 20}
`

// operateLoad is the skewed demand, tokens/s by region, of each lease item.
type operateLoad struct {
	rule, key string
	rates     map[string]float64
}

var operateLoads = func() []operateLoad {
	ls := []operateLoad{
		{"per-tenant", "tenant=acme", map[string]float64{"us": 1500, "eu": 100, "ap": 50}},
		{"per-user", "user=bad0", map[string]float64{"us": 300}},
		{"per-user", "user=bad1", map[string]float64{"eu": 250}},
		{"per-user", "user=bad2", map[string]float64{"us": 150, "ap": 150}},
	}
	for _, u := range []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7"} {
		ls = append(ls, operateLoad{"per-user", "user=" + u, map[string]float64{"us": 3, "eu": 3, "ap": 3}})
	}
	return ls
}()

// TestOperateThreeRegions is issue 16 end to end: three regiond, each on its
// own real redis-server, exchanging over one embedded NATS, behind an admin
// token, under skewed load from a gateway agent in each region. `ration status` shows every
// region ready and every peer heard; `ration inspect` shows the busy key's
// share moving toward the busy region, and each region's applied share as
// its store holds it; `ration top` lists the over-limit keys first; a
// caller without the token is refused.
func TestOperateThreeRegions(t *testing.T) {
	ns, err := embedded.Start(embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(tokenFile, []byte("an-admin-token-of-some-length\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	regions := []string{"us", "eu", "ap"}
	ds := map[string]*regiond.Daemon{}
	var admins []string
	for _, r := range regions {
		d := startRegion(t, regiond.Config{
			Region: r, Regions: regions, NATSURL: ns.ClientURL(), PolicyYAML: []byte(operatePolicy),
			AdminTokenFile: tokenFile, DecideAfter: 50 * time.Millisecond,
		})
		ds[r] = d
		admins = append(admins, d.AdminAddr())
	}
	admin := strings.Join(admins, ",")
	cli := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(append(args, "-admin", admin, "-admin-token-file", tokenFile), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	cliJSON := func(v any, args ...string) int {
		t.Helper()
		code, out, errOut := cli(append(args, "-o", "json")...)
		if err := json.Unmarshal([]byte(out), v); err != nil {
			t.Fatalf("ration %s -o json: exit %d, %v\n%s%s", strings.Join(args, " "), code, err, out, errOut)
		}
		return code
	}

	// Without the token the admin API refuses, and says nothing of a key.
	resp, err := http.Get("http://" + admins[0] + adminapi.PathStatus)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET %s without the token: %d, want 401", adminapi.PathStatus, resp.StatusCode)
	}

	stop := startOperateLoad(t, ds)
	defer stop()

	// Every peer heard, every region ready.
	var st statusJSON
	waitFor(t, "ration status: every region ready and every peer heard", 20*time.Second, func() bool {
		st = statusJSON{}
		if cliJSON(&st, "status") != 0 || len(st.Regions) != 3 {
			return false
		}
		for _, r := range st.Regions {
			if !r.Ready || r.Exchange == nil || len(r.Exchange.Peers) != 2 {
				return false
			}
			for _, p := range r.Exchange.Peers {
				if !p.Heard || p.Stale || p.ReportAge < 0 {
					return false
				}
			}
		}
		return true
	})
	_, table, _ := cli("status")
	t.Logf("ration status:\n%s", table)

	// The busy key's share moves toward us, as inspect shows it, and the
	// applied share inspect reports is the one the store holds.
	const acme = "per-tenant/tenant=acme"
	usShare := func(k inspectJSON) float64 {
		for _, r := range k.Regions {
			if r.Region != "us" || r.Exchange == nil {
				continue
			}
			for _, rs := range r.Exchange.Regions {
				if rs.Region == "us" && rs.Self {
					return rs.Share
				}
			}
		}
		return -1
	}
	var first, k inspectJSON
	if cliJSON(&first, "inspect", acme) != 0 {
		t.Fatalf("inspect: %+v", first)
	}
	waitFor(t, "ration inspect: us's share of acme above 55%", 20*time.Second, func() bool {
		k = inspectJSON{}
		return cliJSON(&k, "inspect", acme) == 0 && usShare(k) > 0.55
	})
	t.Logf("us's share of %s: %.3f at first, %.3f once demand moved it", acme, usShare(first), usShare(k))
	for _, r := range k.Regions {
		if r.Bucket == nil {
			t.Fatalf("inspect: %s has no bucket for %s: %+v", r.Region, acme, r.Key)
		}
		if r.Recent.Admitted == 0 {
			t.Errorf("inspect: %s reports nothing admitted recently for %s", r.Region, acme)
		}
	}
	// The store's share, read around an inspect that saw it unchanged.
	matched := map[string]bool{}
	for try := 0; try < 50 && len(matched) < 3; try++ {
		before := storeShares(t, ds, acme)
		var one inspectJSON
		if cliJSON(&one, "inspect", acme) != 0 {
			continue
		}
		after := storeShares(t, ds, acme)
		for _, r := range one.Regions {
			if before[r.Region] != after[r.Region] || r.Bucket == nil {
				continue
			}
			if got, want := int64(r.Bucket.Share*1e6+0.5), before[r.Region]; got != want {
				t.Fatalf("inspect says %s's applied share is %d ppm, its store holds %d", r.Region, got, want)
			}
			matched[r.Region] = true
		}
	}
	if len(matched) < 3 {
		t.Fatalf("inspect's applied shares compared with the store in only %v", matched)
	}
	_, table, _ = cli("inspect", acme)
	t.Logf("ration inspect %s:\n%s", acme, table)

	// The over-limit keys come first in top by denied.
	over := map[string]bool{acme: true, "per-user/user=bad0": true, "per-user/user=bad1": true, "per-user/user=bad2": true}
	var top topJSON
	waitFor(t, "ration top: the four over-limit keys first", 10*time.Second, func() bool {
		top = topJSON{}
		if cliJSON(&top, "top", "-by", "denied", "-n", "10") != 0 || len(top.Keys) < len(over) {
			return false
		}
		for _, k := range top.Keys[:len(over)] {
			if !over[k.StoreKey] || k.Denied == 0 {
				return false
			}
		}
		return true
	})
	for _, k := range top.Keys[len(over):] {
		if over[k.StoreKey] {
			t.Errorf("top: %s ranked %d, after a key within its limit", k.StoreKey, k.Rank)
		}
	}
	var perUser topJSON
	if cliJSON(&perUser, "top", "-rule", "per-user", "-by", "denied") != 0 || len(perUser.Keys) < 3 {
		t.Fatalf("top -rule per-user: %+v", perUser)
	}
	for _, k := range perUser.Keys[:3] {
		if !strings.HasPrefix(k.StoreKey, "per-user/user=bad") {
			t.Errorf("top -rule per-user: %s among the first three, want the abusers", k.StoreKey)
		}
	}
	_, table, _ = cli("top", "-by", "denied")
	t.Logf("ration top -by denied:\n%s", table)
}

// storeShares reads key's applied share (ppm) from each region's store.
func storeShares(t *testing.T, ds map[string]*regiond.Daemon, key string) map[string]int64 {
	t.Helper()
	m := map[string]int64{}
	for r, d := range ds {
		v, err := d.Share(context.Background(), key)
		if err != nil {
			t.Fatalf("reading %s's share of %s: %v", r, key, err)
		}
		m[r] = v
	}
	return m
}

// startOperateLoad runs a gateway agent in each region (the agent library
// on the region's lease API) and decides operateLoads' demand through it in
// 20 ms steps, until the returned stop is called.
func startOperateLoad(t *testing.T, ds map[string]*regiond.Daemon) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for r, d := range ds {
		a, err := agent.New(agent.Config{Target: d.LeaseAddr(), Logger: quiet, RoundTripTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = a.WaitPolicy(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s's agent: %v", r, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			owed := make([]float64, len(operateLoads))
			ds := make([][]policy.Descriptor, len(operateLoads))
			for i, l := range operateLoads {
				name, value, _ := strings.Cut(l.key, "=")
				ds[i] = []policy.Descriptor{{Key: name, Value: value}}
			}
			last := time.Now()
			for {
				select {
				case <-done:
					return
				case now := <-tick.C:
					dt := now.Sub(last).Seconds()
					last = now
					for i, l := range operateLoads {
						owed[i] += l.rates[r] * dt
						for ; owed[i] >= 1; owed[i]-- {
							a.Allow(context.Background(), ds[i], 1)
						}
					}
				}
			}
		}()
	}
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// waitFor polls ok until it holds, failing the test after within.
func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
}
