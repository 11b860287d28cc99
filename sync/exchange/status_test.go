package exchange

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// TestStatusAndInspect: two regions with demand in eu; eu's holder reports
// its peer heard and the key's shares and demands, its peer lag is scraped,
// and a stopped exchange answers ErrStopped. Run with -race: the answers
// are read on the loop while it runs.
func TestStatusAndInspect(t *testing.T) {
	c := newCluster(t, 50*time.Millisecond, "eu", "us")
	reps, _ := c.runDemand(map[string]int64{"eu": 900, "us": 100})
	// eu above its initial half: us's lowering alone (the gift's first
	// half) leaves eu's applied share where it was.
	c.waitShares("eu takes more share", 10*time.Second, func(sh map[string]int64) bool {
		return sh["eu"] > region.PPM/2 && sh["eu"] > sh["us"]
	})

	eu := reps["eu"].x
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var st Status
	for {
		var err error
		if st, err = eu.Status(ctx); err != nil {
			t.Fatal(err)
		}
		if st.Holder && len(st.Peers) == 1 && !st.Peers[0].Stale {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("status: got %+v, want eu holding with us heard", st)
		}
		time.Sleep(c.period / 5) // polling interval, not a wait for an event
	}
	if p := st.Peers[0]; p.Region != "us" || p.Heard.IsZero() || p.Policy == "" {
		t.Errorf("peer: got %+v, want us heard with its policy", p)
	}
	if st.Period != c.period || st.Epoch == 0 || st.Keys != 1 {
		t.Errorf("status: got %+v, want period %v, an epoch and one key", st, c.period)
	}

	// The view lists us's share as us's latest report did: poll until the
	// report after its lowering has arrived.
	var ks KeyState
	for {
		var err error
		if ks, err = eu.Inspect(ctx, testKey); err != nil {
			t.Fatal(err)
		}
		if v := ks.View; len(v.Regions) == 2 && v.Regions[0].SharePPM > v.Regions[1].SharePPM {
			break
		}
		if ctx.Err() != nil {
			break // the checks below say what is wrong
		}
		time.Sleep(c.period / 5) // polling interval, not a wait for an event
	}
	v := ks.View
	if !ks.Holder || !v.Known || len(v.Regions) != 2 {
		t.Fatalf("inspect: got %+v, want the key known on the holder", ks)
	}
	if r := v.Regions[0]; !r.Self || r.Region != "eu" || r.SharePPM <= v.Regions[1].SharePPM {
		t.Errorf("eu's own part: got %+v, want eu itself with more share than us (%+v)", r, v.Regions[1])
	}
	if v.Regions[0].Demand <= v.Regions[1].Demand {
		t.Errorf("demands: eu %v, us %v; want eu's higher", v.Regions[0].Demand, v.Regions[1].Demand)
	}

	body := gather(t, reps["eu"].reg)
	if !strings.Contains(body, `ration_exchange_peer_lag_seconds{region="us"}`) {
		t.Errorf("eu's metrics lack the peer lag of us:\n%s", body)
	}

	if err := eu.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := eu.Status(context.Background()); !errors.Is(err, ErrStopped) {
		t.Errorf("Status after Shutdown: got %v, want ErrStopped", err)
	}
	if _, err := eu.Inspect(context.Background(), testKey); !errors.Is(err, ErrStopped) {
		t.Errorf("Inspect after Shutdown: got %v, want ErrStopped", err)
	}
}
