package region_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// benchRegions returns three regions exchanging keys active keys, warmed
// up so that every key is in the same generation with rows, plus the latest
// report of the two peers of the first region and the current time.
func benchRegions(b *testing.B, keys int) (sts []*region.State, peers []region.Report, now time.Time) {
	b.Helper()
	names := []string{"r0", "r1", "r2"}
	for _, name := range names {
		sts = append(sts, mustNew(b, region.Config{
			Self: name, Regions: names,
			Policy: func(string) region.KeyPolicy { return region.KeyPolicy{Rate: 1000} },
		}))
	}
	ids := make([]string, keys)
	for k := range ids {
		ids[k] = "bench/" + fmt.Sprint(k)
	}
	now = t0
	reps := make([]region.Report, len(sts))
	for e := 0; e < 4; e++ {
		now = now.Add(time.Second)
		for r, st := range sts {
			for k, id := range ids {
				st.Observe(id, int64(100*(r+1)+k%300), 0)
			}
			reps[r] = epochAll(b, st, now)
		}
		for r, st := range sts {
			for p, rep := range reps {
				if p != r {
					if err := st.Receive(now, rep); err != nil {
						b.Fatalf("Receive: %v", err)
					}
				}
			}
		}
	}
	return sts, reps[1:], now
}

// BenchmarkEpoch measures one region's sync step at 100,000 active global
// keys with 3 regions: Receive the reports of its 2 peers, Epoch, Commit.
// The peers' reports are replayed with new epoch numbers (their counters do
// not change, so merging moves nothing). The local tallies are fed outside
// the timer: "steady" keeps the demand, so no share moves; "moving"
// alternates the region's demand between nothing and a lot, so share is
// given away in some epochs (lowered/op counts the Lower entries, each with
// a gift).
func BenchmarkEpoch(b *testing.B) {
	const keys = 100_000
	for _, bc := range []struct {
		name   string
		demand func(epoch, k int) int64
	}{
		{"steady", func(_, k int) int64 { return int64(100 + k%300) }},
		{"moving", func(epoch, _ int) int64 { return int64(3000 * (epoch % 2)) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			sts, peers, now := benchRegions(b, keys)
			st := sts[0]
			ids := make([]string, keys)
			for k := range ids {
				ids[k] = "bench/" + fmt.Sprint(k)
			}
			var lower int
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for k, id := range ids {
					st.Observe(id, bc.demand(i, k), 0)
				}
				now = now.Add(time.Second)
				b.StartTimer()
				for _, rep := range peers {
					rep.Epoch += uint64(i + 1)
					if err := st.Receive(now, rep); err != nil {
						b.Fatalf("Receive: %v", err)
					}
				}
				p := st.Epoch(now)
				if err := st.Commit(p); err != nil {
					b.Fatalf("Commit: %v", err)
				}
				lower += len(p.Lower)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/keys, "ns/key")
			b.ReportMetric(float64(lower)/float64(b.N), "lowered/op")
		})
	}
}

// BenchmarkPublish measures what the caller does with the state after each
// epoch at 100,000 keys: the report to publish and the snapshot to persist.
func BenchmarkPublish(b *testing.B) {
	sts, _, _ := benchRegions(b, 100_000)
	b.Run("Report", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			_ = sts[0].Report()
		}
	})
	b.Run("Snapshot", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			_ = sts[0].Snapshot()
		}
	})
}

// BenchmarkObserve measures the per-lease tally call on an active key.
func BenchmarkObserve(b *testing.B) {
	st := mustNew(b, region.Config{Self: "r0", Regions: []string{"r0", "r1"}})
	st.Observe("bench/0", 1, 1)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		st.Observe("bench/0", 1, 1)
	}
}

// BenchmarkPersist measures the snapshot an epoch persists at 100,000
// active keys when 1% of them change their demand each epoch: the
// keys whose record may have changed (ration: SnapshotChanges, then Saved)
// beside the whole state (baseline=whole: Snapshot), in one run. The
// three regions' epochs (Tally, Epoch, Commit, Report, Receive) run outside the
// timer; keys/op is the records the snapshot holds.
func BenchmarkPersist(b *testing.B) {
	const keys = 100_000
	for _, mode := range []string{"ration", "baseline=whole"} {
		b.Run(mode, func(b *testing.B) {
			sts, _, now := benchRegions(b, keys)
			st := sts[0]
			ids := make([]string, keys)
			for k := range ids {
				ids[k] = "bench/" + fmt.Sprint(k)
			}
			demand := make([]int64, keys)
			for k := range demand {
				demand[k] = int64(10 + k%90) // under the rate of 1,000 in all
			}
			reps := make([]region.Report, len(sts))
			exchange := func() { receiveAll(b, sts, reps, now) }
			epoch := func(i int) {
				for k := i % 100; k < keys; k += 100 {
					demand[k] = 10 + (demand[k]*7+13)%90
				}
				now = now.Add(time.Second)
				// The exchanger's two phases: tallies, then the epoch.
				for r, st := range sts {
					for k, id := range ids {
						st.Observe(id, demand[k]*int64(r+1), demand[k]*int64(r+1))
					}
					reps[r] = st.Tally(now)
				}
				exchange()
				for r, st := range sts {
					reps[r] = epochAll(b, st, now.Add(250*time.Millisecond))
				}
				exchange()
			}
			// The changes' effects level off within some 30 epochs
			// (BenchmarkEpochAtScale).
			for i := range 40 {
				epoch(i)
				st.SnapshotChanges()
				st.Saved()
			}
			var records int
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				epoch(40 + i)
				b.StartTimer()
				var snap region.Snapshot
				if mode == "ration" {
					snap = st.SnapshotChanges()
				} else {
					snap = st.Snapshot()
				}
				st.Saved()
				records += len(snap.Keys)
			}
			b.ReportMetric(float64(records)/float64(b.N), "keys/op")
		})
	}
}

// BenchmarkTallyHeldKeys measures Tally in a region of three holding
// 100,000 keys in their generation, of which 2% are asked in each epoch (a
// different 2% each time, so every key is asked within IdleAfter and none
// retires) and the rest are held without demand, as most keys of a large
// deployment are at any time. ration steps over held keys at rest
// (keyMeta.idle); baseline=EveryKey visits every key in every phase
// (Config.EveryKey, the reference), as Tally visited every key not asked
// before. Only region r0's Tally is timed; the regions' other phases run
// outside the timer. ns/held-key is per key the region holds.
//
//	go test -run '^$' -bench TallyHeldKeys -benchmem ./region
func BenchmarkTallyHeldKeys(b *testing.B) {
	const keys, every = 100_000, 50
	for _, mode := range []string{"ration", "baseline=EveryKey"} {
		b.Run(mode, func(b *testing.B) {
			names := []string{"r0", "r1", "r2"}
			var sts []*region.State
			for _, name := range names {
				sts = append(sts, mustNew(b, region.Config{
					Self: name, Regions: names, EveryKey: mode != "ration",
					Policy: func(string) region.KeyPolicy { return region.KeyPolicy{Rate: 1000} },
				}))
			}
			ids := make([]string, keys)
			for k := range ids {
				ids[k] = "bench/" + fmt.Sprint(k)
			}
			now := t0
			reps := make([]region.Report, len(sts))
			exchange := func() { receiveAll(b, sts, reps, now) }
			// epoch runs both phases; epoch -1 asks for every key.
			epoch := func(e int, timed bool) {
				now = now.Add(time.Second)
				for r, st := range sts {
					for k := range ids {
						if e < 0 || k%every == e%every {
							st.Observe(ids[k], 50, 50)
						}
					}
					if timed && r == 0 {
						b.StartTimer()
					}
					reps[r] = st.Tally(now)
					if timed && r == 0 {
						b.StopTimer()
					}
				}
				exchange()
				for r, st := range sts {
					reps[r] = epochAll(b, st, now.Add(250*time.Millisecond))
				}
				exchange()
			}
			epoch(-1, false) // every key enters its generation
			for e := range 2 * every {
				epoch(e, false)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.StopTimer()
			for i := 0; i < b.N; i++ {
				epoch(i, true)
			}
			held := sts[0].Keys()
			if held != keys {
				b.Fatalf("r0 holds %d keys, want %d", held, keys)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(held), "ns/held-key")
		})
	}
}

// receiveAll has each region receive the others' reports and apply its
// gifts, as the exchanger does.
func receiveAll(tb testing.TB, sts []*region.State, reps []region.Report, now time.Time) {
	tb.Helper()
	for r, st := range sts {
		for p, rep := range reps {
			if p != r {
				if err := st.Receive(now, rep); err != nil {
					tb.Fatalf("Receive: %v", err)
				}
			}
		}
		st.Apply()
	}
}
