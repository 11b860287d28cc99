package region_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// TestScaleWorkloadMoves drives three States through the workload of
// sync/codec's BenchmarkEpochAtScale (Zipf demand, 1% of the keys changing
// in every region each epoch, no Policy: relative needs), without the codec,
// and logs per region-epoch, over epochs 40 to 69, what the bytes and the
// CPU follow: gifts, share writes, keys listed, keys awake, and the gifts
// by epochs since their key's latest change. It runs only with
// RATION_SCALE_KEYS (and RATION_SCALE_RATE to give the keys a rate):
//
//	RATION_SCALE_KEYS=100000 go test -run TestScaleWorkloadMoves -v ./region
func TestScaleWorkloadMoves(t *testing.T) {
	v := os.Getenv("RATION_SCALE_KEYS")
	if v == "" {
		t.Skip("set RATION_SCALE_KEYS to run")
	}
	keys, err := strconv.Atoi(v)
	if err != nil || keys < 100 {
		t.Fatalf("RATION_SCALE_KEYS=%q: want 100 keys or more", v)
	}
	var rate float64
	if v := os.Getenv("RATION_SCALE_RATE"); v != "" {
		if rate, err = strconv.ParseFloat(v, 64); err != nil {
			t.Fatalf("RATION_SCALE_RATE=%q: %v", v, err)
		}
	}
	names := []string{"ap", "eu", "us"}
	var sts []*region.State
	for _, r := range names {
		sts = append(sts, mustNew(t, region.Config{Self: r, Regions: names,
			Policy: func(string) region.KeyPolicy { return region.KeyPolicy{Rate: rate} }}))
	}
	ids := make([]string, keys)
	for k := range ids {
		ids[k] = fmt.Sprintf("per-tenant/tenant=%07d", k)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	zipf := rand.NewZipf(rng, 1.1, 1, 100_000)
	demand := make([][]int64, len(names))
	for i := range demand {
		demand[i] = make([]int64, keys)
		for k := range demand[i] {
			demand[i][k] = 1 + int64(zipf.Uint64())
		}
	}
	changed := make(map[string]int, keys)
	var gifts, writes, tallied, listed, awake, n int
	var byAge [12]int
	now := t0
	deliver := func(reps []region.Report) (applied int) {
		for i, st := range sts {
			for j, rep := range reps {
				if i != j {
					if err := st.Receive(now, rep); err != nil {
						t.Fatal(err)
					}
				}
			}
			applied += len(st.Apply())
		}
		return applied
	}
	for e := 0; e < 70; e++ {
		for range keys / 100 {
			k := rng.IntN(keys)
			changed[ids[k]] = e
			for i := range demand {
				demand[i][k] = 1 + int64(zipf.Uint64())
			}
		}
		now = now.Add(time.Second)
		var treps, xreps []region.Report
		for i, st := range sts {
			for k, id := range ids {
				st.Observe(id, demand[i][k], demand[i][k])
			}
			treps = append(treps, st.Tally(now))
		}
		deliver(treps)
		w := 0
		for _, st := range sts {
			p := st.Epoch(now.Add(250 * time.Millisecond))
			if e >= 40 {
				gifts += len(p.Lower)
				for _, c := range p.Lower {
					byAge[min(e-changed[c.Key], len(byAge)-1)]++
				}
			}
			w += len(p.Lower) + len(p.Raise)
			if err := st.Commit(p); err != nil {
				t.Fatal(err)
			}
			xreps = append(xreps, st.Report())
		}
		w += deliver(xreps)
		if e < 40 {
			continue
		}
		writes += w
		for i := range sts {
			n++
			tallied += len(treps[i].Keys)
			listed += len(xreps[i].Keys)
			resting, all := sts[i].Resting()
			awake += all - resting
		}
	}
	f := float64(n)
	t.Logf("%d keys, rate %v, per region-epoch: %.0f gifts, %.0f share writes, %.0f keys in tally reports, %.0f in exchange reports, %.2f%% of the keys awake",
		keys, rate, float64(gifts)/f, float64(writes)/f, float64(tallied)/f, float64(listed)/f, 100*float64(awake)/f/float64(keys))
	t.Logf("gifts by epochs since their key's change (the last: %d or more): %v", len(byAge)-1, byAge)
}
