package region_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// aboutToGive returns regions a and b, and a plan of b that gives share to
// a (b's Lower entry for "r/k"), not yet committed.
func aboutToGive(t *testing.T) (a, b *region.State, now time.Time, plan region.Plan, entry region.ShareChange) {
	t.Helper()
	regions := []string{"a", "b"}
	a = mustNew(t, region.Config{Self: "a", Regions: regions})
	b = mustNew(t, region.Config{Self: "b", Regions: regions})
	now = t0
	for i := 0; i < 10; i++ {
		now = now.Add(time.Second)
		a.Observe("r/k", 3000, 3000)
		if err := b.Receive(now, epochAll(t, a, now)); err != nil {
			t.Fatalf("Receive: %v", err)
		}
		plan = b.Epoch(now)
		for _, c := range plan.Lower {
			if c.Key == "r/k" && c.SharePPM < b.Share("r/k") {
				return a, b, now, plan, c
			}
		}
		if err := b.Commit(plan); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		if err := a.Receive(now, b.Report()); err != nil {
			t.Fatalf("Receive: %v", err)
		}
	}
	t.Fatalf("setup: b never planned to give to a")
	return
}

func rowOf(t *testing.T, rep region.Report, key string) []int64 {
	t.Helper()
	for _, k := range rep.Keys {
		if k.Key == key {
			return k.Row
		}
	}
	t.Fatalf("key %q not in the report", key)
	return nil
}

// TestCommitGivesAfterLower checks the protocol's order: the plan lowers
// b's share by the gift before anything is given, the report shows the gift
// only once Commit recorded it, and the lowered share is exactly the share
// b computes after the gift.
func TestCommitGivesAfterLower(t *testing.T) {
	_, b, _, plan, entry := aboutToGive(t)
	before := rowOf(t, b.Report(), "r/k")[0]
	if entry.SharePPM >= b.Share("r/k") {
		t.Fatalf("Lower entry %d, want below the applied share %d", entry.SharePPM, b.Share("r/k"))
	}
	if err := b.Commit(plan); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	after := rowOf(t, b.Report(), "r/k")[0]
	if after <= before {
		t.Fatalf("row toward a after Commit: got %d, want above %d (the gift)", after, before)
	}
	if got := b.Share("r/k"); got != entry.SharePPM {
		t.Errorf("Share after Commit: got %d, want the lowered share %d", got, entry.SharePPM)
	}
}

// TestCommitDroppedLower checks that a Lower entry whose store write failed
// gives nothing, and that the next epoch writes the share again before any
// gift.
func TestCommitDroppedLower(t *testing.T) {
	_, b, now, plan, _ := aboutToGive(t)
	before := rowOf(t, b.Report(), "r/k")[0]
	kept := plan.Lower[:0]
	for _, c := range plan.Lower {
		if c.Key != "r/k" {
			kept = append(kept, c)
		}
	}
	plan.Lower = kept
	if err := b.Commit(plan); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if got := rowOf(t, b.Report(), "r/k")[0]; got != before {
		t.Fatalf("row toward a after a dropped Lower: got %d, want %d (nothing given)", got, before)
	}
	next := b.Epoch(now.Add(time.Second))
	found := false
	for _, c := range next.Lower {
		found = found || c.Key == "r/k"
	}
	if !found {
		t.Fatalf("next plan: got Lower %v, want it to write r/k again", next.Lower)
	}
}

// TestCommitRejects checks that a plan that is stale, committed twice, or
// edited is rejected and records nothing.
func TestCommitRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(b *region.State, now time.Time, p region.Plan) (region.Plan, error)
		want error
	}{
		{"twice", func(b *region.State, _ time.Time, p region.Plan) (region.Plan, error) {
			if err := b.Commit(p); err != nil {
				return p, err
			}
			return p, nil
		}, region.ErrStalePlan},
		{"superseded", func(b *region.State, now time.Time, p region.Plan) (region.Plan, error) {
			b.Epoch(now.Add(time.Second))
			return p, nil
		}, region.ErrStalePlan},
		{"edited share", func(_ *region.State, _ time.Time, p region.Plan) (region.Plan, error) {
			p.Lower[0].SharePPM++
			return p, nil
		}, region.ErrInvalidPlan},
		{"hand-made entry", func(_ *region.State, _ time.Time, p region.Plan) (region.Plan, error) {
			p.Lower = append(p.Lower, region.ShareChange{Key: "r/k", SharePPM: 1})
			return p, nil
		}, region.ErrInvalidPlan},
		{"zero plan", func(*region.State, time.Time, region.Plan) (region.Plan, error) {
			return region.Plan{}, nil
		}, region.ErrStalePlan},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, b, now, plan, _ := aboutToGive(t)
			p, err := tc.do(b, now, plan)
			if err != nil {
				t.Fatalf("setup: %v", err)
			}
			before := rowOf(t, b.Report(), "r/k")[0]
			if err := b.Commit(p); !errors.Is(err, tc.want) {
				t.Fatalf("Commit: got error %v, want %v", err, tc.want)
			}
			if got := rowOf(t, b.Report(), "r/k")[0]; got != before {
				t.Errorf("row after a rejected Commit: got %d, want %d", got, before)
			}
		})
	}
}
