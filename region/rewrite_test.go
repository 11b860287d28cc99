package region_test

import (
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// TestRewriteOldShares checks Config.Rewrite: a share the store confirmed
// is written again, as a Raise of the same value, once its latest write is
// Rewrite old, and not before; a write that never returns (no Wrote) is
// asked for again each epoch until one does.
func TestRewriteOldShares(t *testing.T) {
	st := mustNew(t, region.Config{Self: "a", Regions: []string{"a"}, Rewrite: 10 * time.Second})
	now := t0
	var rewrites []time.Duration // when, after the first write, a Raise of the same share came
	var first time.Time
	lost := false
	for i := 0; i < 40; i++ {
		now = now.Add(time.Second)
		st.Observe("r/k", 10, 10)
		p := st.Epoch(now)
		st.Wrote(p.Lower)
		if err := st.Commit(p); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		for _, c := range p.Lower {
			if first.IsZero() && c.Key == "r/k" {
				first = now
			}
		}
		for _, c := range p.Raise {
			if c.Key != "r/k" || c.SharePPM != region.PPM {
				t.Fatalf("epoch %d: unexpected Raise %+v", i, c)
			}
			rewrites = append(rewrites, now.Sub(first))
			if len(rewrites) == 2 && !lost {
				lost = true // this write's answer never comes
				continue
			}
			st.Wrote([]region.ShareChange{c})
		}
	}
	want := []time.Duration{10 * time.Second, 20 * time.Second, 21 * time.Second, 31 * time.Second}
	if len(rewrites) != len(want) {
		t.Fatalf("rewrites at %v after the first write, want %v", rewrites, want)
	}
	for i := range want {
		if rewrites[i] != want[i] {
			t.Fatalf("rewrites at %v after the first write, want %v", rewrites, want)
		}
	}
}
