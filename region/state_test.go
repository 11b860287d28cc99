package region_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/region"
)

func TestConfig(t *testing.T) {
	ok := region.Config{Self: "b", Regions: []string{"a", "b", "c"}}
	got := mustNew(t, ok).Config()
	want := region.Config{
		Self: "b", Replica: "0", Regions: []string{"a", "b", "c"},
		Period: time.Second, Alpha: 0.9, FloorPPM: 5_000, MinTransferPPM: 1_000, SettledPPM: 40_000,
		StaleAfter: 3 * time.Second, IdleAfter: 60 * time.Second, Grace: 10 * time.Second, Rewrite: 6 * time.Hour, Refresh: 600,
	}
	if diff := cmp.Diff(want, got, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Policy" }, cmp.Ignore())); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if init := mustNew(t, ok).Initial("a"); init != 333_334 {
		t.Errorf("Initial(a) with the default equal split: got %d, want 333334", init)
	}
	for _, tc := range []struct {
		name  string
		tweak func(*region.Config)
	}{
		{"no regions", func(c *region.Config) { c.Regions = nil }},
		{"self missing", func(c *region.Config) { c.Self = "z" }},
		{"no self", func(c *region.Config) { c.Self = "" }},
		{"unsorted", func(c *region.Config) { c.Regions = []string{"b", "a"} }},
		{"duplicate", func(c *region.Config) { c.Regions = []string{"a", "b", "b"} }},
		{"alpha above 1", func(c *region.Config) { c.Alpha = 1.5 }},
		{"floor above an equal split", func(c *region.Config) { c.FloorPPM = 400_000 }},
		{"negative grace", func(c *region.Config) { c.Grace = -time.Second }},
		{"refresh above an hour of epochs", func(c *region.Config) { c.Refresh = 3601 }},
		{"period too short", func(c *region.Config) { c.Period = time.Microsecond }},
		{"initial of an unknown region", func(c *region.Config) { c.Initial = map[string]int64{"z": 1} }},
		{"initial above PPM in sum", func(c *region.Config) { c.Initial = map[string]int64{"a": 600_000, "b": 600_000} }},
		{"negative initial", func(c *region.Config) { c.Initial = map[string]int64{"a": -1} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			cfg.Regions = slices.Clone(ok.Regions)
			tc.tweak(&cfg)
			if _, err := region.New(cfg); !errors.Is(err, region.ErrInvalidConfig) {
				t.Errorf("New: got error %v, want ErrInvalidConfig", err)
			}
			if err := cfg.Validate(); !errors.Is(err, region.ErrInvalidConfig) {
				t.Errorf("Validate: got error %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// TestSnapshotRoundTrip checks that a restored State persists the same
// state, and that a restored region goes on without giving anything twice:
// its first plan rewrites every share before any gift.
func TestSnapshotRoundTrip(t *testing.T) {
	a, _, now, _ := twoRegions(t)
	snap := a.Snapshot()
	if len(snap.Keys) == 0 {
		t.Fatalf("setup: empty snapshot")
	}
	b := mustNew(t, a.Config())
	if err := b.Restore(snap); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if diff := cmp.Diff(snap, b.Snapshot()); diff != "" {
		t.Errorf("Snapshot after Restore (-persisted +restored):\n%s", diff)
	}
	p := b.Epoch(now.Add(time.Second))
	if len(p.Lower) != len(snap.Keys) || len(p.Raise) != 0 {
		t.Errorf("first plan after Restore: got %d Lower and %d Raise entries, want %d Lower (every share rewritten first)", len(p.Lower), len(p.Raise), len(snap.Keys))
	}
}

func TestRestoreRejects(t *testing.T) {
	a, _, _, _ := twoRegions(t)
	for _, tc := range []struct {
		name   string
		damage func(s *region.Snapshot)
		want   error
	}{
		{"another region's", func(s *region.Snapshot) { s.Region = "b" }, region.ErrUnknownRegion},
		{"unsorted regions", func(s *region.Snapshot) { s.Regions[0], s.Regions[1] = s.Regions[1], s.Regions[0] }, region.ErrMalformed},
		{"short row", func(s *region.Snapshot) { s.Keys[0].Row = s.Keys[0].Row[:1] }, region.ErrMalformed},
		{"negative counter", func(s *region.Snapshot) { s.Keys[0].In[1] = -1 }, region.ErrMalformed},
		{"duplicate key", func(s *region.Snapshot) { s.Keys = append(s.Keys, s.Keys[0]) }, region.ErrMalformed},
		{"no generation, no exit", func(s *region.Snapshot) { s.Keys[0].Generation = 0 }, region.ErrMalformed},
		{"heard of the wrong length", func(s *region.Snapshot) { s.Heard = s.Heard[:1] }, region.ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := mustNew(t, a.Config())
			if err := st.Restore(a.Snapshot()); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			before := st.Snapshot()
			bad := a.Snapshot()
			tc.damage(&bad)
			if err := st.Restore(bad); !errors.Is(err, tc.want) {
				t.Fatalf("Restore: got error %v, want %v", err, tc.want)
			}
			if diff := cmp.Diff(before, st.Snapshot()); diff != "" {
				t.Errorf("a rejected Restore changed the state (-before +after):\n%s", diff)
			}
		})
	}
}

// TestFollowerTallies checks that the exchanging replica of a region sums
// the tallies its other replicas publish: region a's demand is all at its
// follower replica, and a still gets the share for it.
func TestFollowerTallies(t *testing.T) {
	regions := []string{"a", "b"}
	lead := mustNew(t, region.Config{Self: "a", Replica: "a-0", Regions: regions})
	follow := mustNew(t, region.Config{Self: "a", Replica: "a-1", Regions: regions})
	b := mustNew(t, region.Config{Self: "b", Regions: regions})
	now := t0
	for i := 0; i < 8; i++ {
		now = now.Add(time.Second)
		follow.Observe("r/k", 900, 900)
		b.Observe("r/k", 100, 100)
		tally := follow.Tally(now)
		if tally.Exchange {
			t.Fatalf("Tally: got an exchange report, want tallies only")
		}
		ra, rb := epochAll(t, lead, now), epochAll(t, b, now)
		for _, x := range []struct {
			st  *region.State
			rep region.Report
		}{{lead, tally}, {b, tally}, {lead, rb}, {b, ra}} {
			if err := x.st.Receive(now, x.rep); err != nil {
				t.Fatalf("Receive from %s/%s: %v", x.rep.Region, x.rep.Replica, err)
			}
		}
	}
	if a, bb := lead.Share("r/k"), b.Share("r/k"); a <= 3*bb {
		t.Errorf("shares with 90%% of the demand at a's follower: a %d, b %d, want a well above b", a, bb)
	}
}

// TestObserveIgnoresBadInput checks that bad tallies change nothing.
func TestObserveIgnoresBadInput(t *testing.T) {
	st := mustNew(t, region.Config{Self: "a", Regions: []string{"a", "b"}})
	st.Observe("", 5, 5)
	if got := st.Keys(); got != 0 {
		t.Errorf("Keys after Observe with an empty key: got %d, want 0", got)
	}
	st.Observe("r/k", -5, -1)
	if got := st.Keys(); got != 0 {
		t.Errorf("Keys after Observe with negative tallies: got %d, want 0", got)
	}
}

// TestSawStore: the first incarnation is a baseline, the same one again
// changes nothing, a new one makes the next Epoch write every share again.
func TestSawStore(t *testing.T) {
	st, err := region.New(region.Config{Self: "eu", Regions: []string{"eu", "us"}})
	if err != nil {
		t.Fatal(err)
	}
	st.Observe("k", 10, 10)
	now := time.Unix(1_700_000_000, 0)
	p := st.Epoch(now)
	if err := st.Commit(p); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		inc        string
		resync     bool
		wantWrites bool
	}{{"a", false, false}, {"a", false, false}, {"b", true, true}, {"b", false, false}} {
		if got := st.SawStore(tc.inc); got != tc.resync {
			t.Errorf("step %d: SawStore(%q) got %v, want %v", i, tc.inc, got, tc.resync)
		}
		now = now.Add(time.Second)
		st.Observe("k", 10, 10)
		p := st.Epoch(now)
		if got := len(p.Lower)+len(p.Raise) > 0; got != tc.wantWrites {
			t.Errorf("step %d: plan writes %v/%v, want writes %v", i, p.Lower, p.Raise, tc.wantWrites)
		}
		if err := st.Commit(p); err != nil {
			t.Fatal(err)
		}
	}
}
