package region_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/region"
)

// TestInspect: after a few epochs in which a had demand and b gave it
// share, each region's view of the key shows the shares and demands it
// heard, and reading it changes nothing.
func TestInspect(t *testing.T) {
	a, b, now, _ := twoRegions(t)
	before := a.Debug("r/k")
	v := a.Inspect("r/k")
	if after := a.Debug("r/k"); after != before {
		t.Errorf("Inspect changed the key's state:\n%s\n%s", before, after)
	}
	if !v.Known || v.Key != "r/k" || len(v.Regions) != 3 {
		t.Fatalf("Inspect: got %+v, want the key known with three regions", v)
	}
	self := v.Regions[0]
	if !self.Self || self.Region != "a" || self.SharePPM != a.Share("r/k") || self.Demand <= 0 || !self.Heard.IsZero() {
		t.Errorf("a's own view: got %+v, want its share %d, some demand, no heard time", self, a.Share("r/k"))
	}
	peer := v.Regions[1]
	if peer.Self || peer.Region != "b" || peer.SharePPM != b.Share("r/k") || peer.Demand != 0 || !peer.Heard.Equal(now) {
		t.Errorf("b as a sees it: got %+v, want b's share %d, no demand, heard at %v", peer, b.Share("r/k"), now)
	}
	if peer := v.Regions[2]; peer.SharePPM != a.Initial("c") || !peer.Heard.IsZero() {
		t.Errorf("c, never heard: got %+v, want its initial share %d", peer, a.Initial("c"))
	}
	var sum int64
	for _, r := range v.Regions {
		sum += r.SharePPM
	}
	if sum > region.PPM {
		t.Errorf("shares as a sees them sum to %d, above %d", sum, region.PPM)
	}

	unknown := a.Inspect("r/none")
	want := region.KeyView{Key: "r/none", Regions: []region.RegionView{
		{Region: "a", Self: true, SharePPM: a.Initial("a")},
		{Region: "b", SharePPM: a.Initial("b"), Heard: now},
		{Region: "c", SharePPM: a.Initial("c")},
	}}
	if diff := cmp.Diff(want, unknown); diff != "" {
		t.Errorf("Inspect of an unknown key (-want +got):\n%s", diff)
	}
	if a.Keys() != 1 {
		t.Errorf("Inspect of an unknown key added it: %d keys", a.Keys())
	}
}
