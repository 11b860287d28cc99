package regiond

import (
	"context"
	"testing"
	"time"

	leasev1 "github.com/ration-dev/ration/lease/v1"
)

// tenMinutes is the quota: 1,000 tokens per 10 minutes, shared by
// every region, the whole of it in the bucket.
const tenMinutes = `
rules:
  - name: quota
    key: [tenant]
    limit: 1000
    period: 10m
    burst: 1000
`

// TestLongQuotaMovesWithDemand runs three regions on their own
// redis-servers, exchanging over embedded NATS, with one global quota of
// 1,000 tokens per 10 minutes and all demand in us. The exchange moves the
// share to us and, with it, the tokens the other regions' buckets hold: in
// 10 s us admits at least 95% of what one ideal bucket admits (b + L × 10 s
// = 1,016.7), and at no point more than the ideal bucket plus the bound's
// terms (one cost a region; grants are counted as they are made, so leases
// add nothing). Before tokens moved with share, us admitted 348.
func TestLongQuotaMovesWithDemand(t *testing.T) {
	regions := []string{"ap", "eu", "us"}
	dep := newDeployment(t, regions...)
	for _, r := range regions {
		dep.addWith(r, r+"-0", func(c *Config) { c.PolicyYAML = []byte(tenMinutes) })
	}
	const (
		limit, burst = 1000.0, 1000.0
		rate         = limit / 600 // tokens/s
		window       = 10 * time.Second
	)
	us := client(t, dep.nodes["us"][0])
	var admitted int64
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond) // 4,000 tokens/s asked: far above the quota
	defer tick.Stop()
	for now := range tick.C {
		elapsed := now.Sub(start)
		if elapsed > window {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := us.Lease(ctx, &leasev1.LeaseRequest{
			Agent: &leasev1.Agent{Id: "load-us"},
			Items: []*leasev1.LeaseItem{{Rule: "quota", Key: "tenant=acme", Want: 20, Demand: 20}},
		})
		cancel()
		if err != nil {
			t.Fatalf("lease at %v: %v", elapsed, err)
		}
		admitted += resp.GetGrants()[0].GetGranted()
		// The ideal bucket admits at most b + L × t by t; the fleet may
		// add one cost a region (a bucket never holds less than one cost).
		if most := burst + rate*time.Since(start).Seconds() + float64(len(regions)); float64(admitted) > most {
			t.Fatalf("at %v: admitted %d, more than the ideal bucket's %.1f plus a cost a region", elapsed, admitted, most-float64(len(regions)))
		}
	}
	ideal := burst + rate*window.Seconds()
	t.Logf("us admitted %d in %v; one ideal bucket admits %.1f (%.1f%%)", admitted, window, ideal, 100*float64(admitted)/ideal)
	if float64(admitted) < 0.95*ideal {
		t.Errorf("us admitted %d in %v, want at least 95%% of the ideal bucket's %.1f", admitted, window, ideal)
	}
}
