package regiond

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// perTenant is a policy of the one global rule the exchange tests move,
// with the limit given (burst twice it).
func perTenant(limit int) string {
	return strings.NewReplacer("LIMIT", strconv.Itoa(limit), "BURST", strconv.Itoa(2*limit)).Replace(
		"rules:\n  - {name: per-tenant, key: [tenant], limit: LIMIT, period: 1s, burst: BURST}\n")
}

// TestRegionsDisagreeOnALimit runs three regions on real Redis over NATS
// whose policies agree, then raises one region's limit of the global rule
// tenfold in its file alone: every region holds the key's shares where they
// are (ration_exchange_rule_disagreement says so), the raised region
// enforces the smaller limit, and the fleet, under demand far above the
// limit everywhere, admits no more than the smaller limit allows plus the
// burst. Once the file agrees again, the shares follow demand again.
func TestRegionsDisagreeOnALimit(t *testing.T) {
	regions := []string{"ap", "eu", "us"}
	dep := newDeployment(t, regions...)
	dir := t.TempDir()
	files := map[string]string{}
	for _, r := range regions {
		files[r] = filepath.Join(dir, r+".yaml")
		if err := os.WriteFile(files[r], []byte(perTenant(1000)), 0o600); err != nil {
			t.Fatal(err)
		}
		dep.addWith(r, r+"-0", func(c *Config) { c.PolicyFile = files[r]; c.PolicyInterval = time.Hour }) // Reload applies a change
	}
	phase1 := map[string]int64{"us": 900, "eu": 100}
	l := dep.load(phase1)
	dep.observe("us takes the share", 10*time.Second, func(sh map[string]int64) bool {
		return within5(sh, targets(regions, phase1), regions...)
	})

	// eu alone raises the limit tenfold.
	if err := os.WriteFile(files["eu"], []byte(perTenant(10_000)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := dep.nodes["eu"][0].Reload(); err != nil {
		t.Fatal(err)
	}
	held := func() bool {
		for _, r := range regions {
			if metricSum(t, dep.nodes[r][0], "ration_exchange_rule_disagreement", "rule", "per-tenant") != 1 {
				return false
			}
		}
		return true
	}
	waitFor(t, held)
	if got := dep.nodes["eu"][0].Service().Policy().Rule("per-tenant").Limit; got != 1000 {
		t.Fatalf("eu enforces limit %d while the others say 1000, want 1000", got)
	}
	if got := metricSum(t, dep.nodes["eu"][0], "ration_policy_stricter_rules"); got != 1 {
		t.Errorf("eu's ration_policy_stricter_rules = %v, want 1", got)
	}

	// Demand moves to ap and rises everywhere far above the limit: the
	// shares stay, and the fleet admits the smaller limit's worth.
	l.set(map[string]int64{"ap": 3000, "eu": 3000, "us": 3000})
	frozen := dep.shares()
	start := time.Now()
	before := l.total()
	const window = 6 * time.Second
	for time.Since(start) < window {
		sh := dep.shares()
		for _, r := range regions {
			if sh[r] != frozen[r] {
				t.Fatalf("%s's share moved from %d to %d while the regions disagree: %v", r, frozen[r], sh[r], sh)
			}
		}
		time.Sleep(syncPeriod / 2) // sampling interval
	}
	w := time.Since(start).Seconds()
	admitted := l.total() - before
	// L·W + b: the smaller limit over the window, plus one burst of the
	// fleet's buckets (their capacities sum to b); an exchange that moved
	// nothing adds no more. Had eu enforced its own limit it would refill
	// at 10,000 × its share alone.
	bound := 1000*w + 2000
	t.Logf("while they disagree: admitted %d tokens in %.1fs (%.0f/s), bound L·W + b = %.0f; shares %v", admitted, w, float64(admitted)/w, bound, frozen)
	if float64(admitted) > bound {
		t.Errorf("admitted %d tokens in %.1fs while the regions disagree, more than L·W + b = %.0f", admitted, w, bound)
	}

	// eu agrees again: the exchange resumes and share follows demand.
	if err := os.WriteFile(files["eu"], []byte(perTenant(1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := dep.nodes["eu"][0].Reload(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !held() })
	phase3 := map[string]int64{"ap": 900, "eu": 50, "us": 50}
	l.set(phase3)
	dep.observe("ap takes the share once they agree", 15*time.Second, func(sh map[string]int64) bool {
		return within5(sh, targets(regions, phase3), regions...)
	})
}

// total is every region's granted tokens so far.
func (l *load) total() int64 {
	var n int64
	for _, g := range l.granted {
		n += g.Load()
	}
	return n
}
