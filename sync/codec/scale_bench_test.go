package codec

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/ration-dev/ration/region"
)

// scaleKeys is BenchmarkEpochAtScale's keys per region: 1,000,000, or
// RATION_SCALE_KEYS.
func scaleKeys(b *testing.B) int {
	if v := os.Getenv("RATION_SCALE_KEYS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("RATION_SCALE_KEYS=%q: want a positive number of keys", v)
		}
		return n
	}
	return 1_000_000
}

func keysLabel(n int) string {
	switch {
	case n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n%1_000 == 0:
		return fmt.Sprintf("%dk", n/1_000)
	}
	return strconv.Itoa(n)
}

// scalePolicy is the policy of BenchmarkEpochAtScale's keys: a per-tenant
// rule of 100,000 tokens a second, a second of burst.
var scalePolicy = region.KeyPolicy{Rule: "per-tenant", Rate: 100_000, Burst: 100_000, Cost: 1}

// BenchmarkEpochAtScale is one sync epoch of three regions at a million
// active global keys each (RATION_SCALE_KEYS to change), with Zipf demand
// (s = 1.1 over 1–100,000 tokens an epoch in each region: a median of
// about 30, thousands for a tenth of the keys) of which 1% of the keys
// change in every region each epoch, the rest steady, measured once 40
// epochs have brought the changes' effects to their steady state. Every
// key has a rule's rate (scalePolicy), as every key a policy holds does;
// the demand's tail, about 1% of the keys, is over it. (Until 2 December
// 2026 the keys had no rate, as only keys whose rule left the policy have:
// they steer by relative needs.)
//
// Reports as deltas (ration, the default Config.Refresh) beside full
// reports (baseline=full, Refresh -1), in one run. The demand is fed to
// each region outside the timer (the lease service pays for it, once per
// lease call); everything else an epoch costs is timed: Tally and encode,
// decode and merge of the peers' tallies, Epoch, Commit, Report and encode,
// decode and merge of the peers' reports, Apply. ms/region-epoch and
// wire-B/region-epoch are per region and epoch; B/op is for the three
// regions. cpu-ms/region-epoch is the process's CPU time over the same
// timed work (every thread, the garbage collector's included): on a shared
// machine wall time measures the load as much as the work.
//
//	go test -run '^$' -bench EpochAtScale -benchmem -benchtime 3x -timeout 1h ./sync/codec
func BenchmarkEpochAtScale(b *testing.B) {
	keys := scaleKeys(b)
	for _, mode := range []struct {
		name    string
		refresh int
	}{{"ration", 0}, {"baseline=full", -1}} {
		b.Run(fmt.Sprintf("%s/keys=%s", mode.name, keysLabel(keys)), func(b *testing.B) {
			br := newBenchRegionsWith(b, keys, codecs[0].codec, mode.refresh, scalePolicy)
			rng := rand.New(rand.NewPCG(3, 4))
			zipf := rand.NewZipf(rng, 1.1, 1, 100_000)
			for i := range br.demand {
				for k := range br.demand[i] {
					br.demand[i][k] = 1 + int64(zipf.Uint64())
				}
			}
			over := 0
			for k := range keys {
				var sum int64
				for i := range br.demand {
					sum += br.demand[i][k]
				}
				if float64(sum) > scalePolicy.Rate {
					over++
				}
			}
			b.Logf("%.2f%% of the keys demand more than their rate of %.0f/s", 100*float64(over)/float64(keys), scalePolicy.Rate)
			change := func() {
				for c := 0; c < keys/100; c++ {
					k := rng.IntN(keys)
					for i := range br.demand {
						br.demand[i][k] = 1 + int64(zipf.Uint64())
					}
				}
			}
			// Every key enters its generation (the first reports are
			// full), and the changes reach their steady state: the
			// moves and listings they cause level off within some 35
			// epochs (a small key's smoothed demand follows a few
			// requests an epoch slowly).
			for i := 0; i < 40; i++ {
				change()
				br.epoch(b)
			}
			br.pause, br.cpu = b, &cpuClock{}
			b.ReportAllocs()
			b.ResetTimer()
			var bytes int
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				change()
				b.StartTimer()
				br.cpu.start()
				br.epoch(b)
				br.cpu.stop()
				bytes += br.bytes
			}
			per := float64(b.N * len(br.names))
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/per, "ms/region-epoch")
			b.ReportMetric(float64(bytes)/per, "wire-B/region-epoch")
			b.ReportMetric(float64(br.cpu.total.Microseconds())/1000/per, "cpu-ms/region-epoch")
		})
	}
}
