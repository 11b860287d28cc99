package codec

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// benchRegions is a deployment of region.States exchanging in-process
// through the codec: everything an epoch costs except NATS and the store.
type benchRegions struct {
	names  []string
	states []*region.State
	keys   []string
	demand [][]int64 // per region, per key: tokens per epoch
	now    time.Time
	asm    []*Assembler
	msgs   [][][]byte // per region: its latest report's messages
	bytes  int        // bytes published in the latest epoch, all regions
	codec  codec
	// pause, when set, is the benchmark whose timer stops while local
	// demand is observed (the lease service pays for that, per call), and
	// cpu the process CPU clock that stops with it.
	pause *testing.B
	cpu   *cpuClock
}

// cpuClock sums the process's CPU time (user and system, every thread:
// the garbage collector's too) over the intervals between start and stop.
// On a shared machine it measures the work where wall time measures the
// load. The goroutine carries the profiler label timed=yes between start
// and stop, so that a CPU profile of the benchmark shows the timed work
// alone (go tool pprof -tagfocus timed=yes; the garbage collector's
// background workers carry no label).
type cpuClock struct {
	total, from time.Duration
}

func (c *cpuClock) start() {
	c.from = processCPU()
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("timed", "yes")))
}
func (c *cpuClock) stop() {
	c.total += processCPU() - c.from
	pprof.SetGoroutineLabels(context.Background())
}

// codec is an encoder and a decoder of reports, so that one benchmark run
// compares the package's codec with the generated code's.
type codec struct {
	encode func(r *region.Report, id uint64, maxBytes int) ([][]byte, error)
	decode func(msg []byte, lim Limits) (*Part, error)
}

// codecs are the sub-benchmarks: ration (EncodeReport, DecodePart, in
// Latest), the same in version 1 (key messages), and the codec through
// proto.Marshal and proto.Unmarshal that the hand-written one replaced.
var codecs = []struct {
	name string
	codec
}{
	{"ration", codec{EncodeReport, DecodePart}},
	{"baseline=V1", codec{encodeV1, DecodePart}},
	{"baseline=generated", codec{encodeReportGenerated, decodePartGenerated}},
}

func encodeV1(r *region.Report, id uint64, maxBytes int) ([][]byte, error) {
	return EncodeReportVersion(r, id, maxBytes, V1)
}

const benchMaxPayload = 1 << 20 // NATS's default max_payload

func newBenchRegions(tb testing.TB, nkeys int, c codec) *benchRegions {
	return newBenchRegionsWith(tb, nkeys, c, -1, region.KeyPolicy{})
}

// newBenchRegionsWith is newBenchRegions with the regions' Config.Refresh
// (-1: full reports, as the exchange sent before deltas).
func newBenchRegionsWith(tb testing.TB, nkeys int, c codec, refresh int, pol region.KeyPolicy) *benchRegions {
	tb.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	b := &benchRegions{names: []string{"ap", "eu", "us"}, now: time.Unix(1_700_000_000, 0), codec: c}
	for i := 0; i < nkeys; i++ {
		b.keys = append(b.keys, fmt.Sprintf("per-tenant/tenant=%07d", i))
	}
	for _, r := range b.names {
		st, err := region.New(region.Config{Self: r, Regions: b.names, Refresh: refresh,
			Policy: func(string) region.KeyPolicy { return pol }})
		if err != nil {
			tb.Fatal(err)
		}
		d := make([]int64, nkeys)
		for i := range d {
			d[i] = rng.Int64N(1000)
		}
		b.states = append(b.states, st)
		b.demand = append(b.demand, d)
		b.asm = append(b.asm, NewAssembler(AssemblerConfig{}))
	}
	b.msgs = make([][][]byte, len(b.names))
	return b
}

// tally runs the first phase of an epoch in region i: observe, close the
// tallies and encode the tally-only report.
func (b *benchRegions) tally(tb testing.TB, i int) {
	st := b.states[i]
	if b.pause != nil {
		b.pause.StopTimer()
		b.cpu.stop()
	}
	for k, key := range b.keys {
		st.Observe(key, b.demand[i][k], b.demand[i][k])
	}
	if b.pause != nil {
		b.cpu.start()
		b.pause.StartTimer()
	}
	rep := st.Tally(b.now)
	b.encode(tb, i, &rep, 1)
}

// produce runs the sending half of the second phase in region i: compute,
// commit, report and encode.
func (b *benchRegions) produce(tb testing.TB, i int) {
	st := b.states[i]
	p := st.Epoch(b.now.Add(250 * time.Millisecond))
	if err := st.Commit(p); err != nil {
		tb.Fatal(err)
	}
	rep := st.Report()
	b.encode(tb, i, &rep, 2)
}

func (b *benchRegions) encode(tb testing.TB, i int, rep *region.Report, phase uint64) {
	msgs, err := b.codec.encode(rep, uint64(i)<<40|uint64(b.now.Unix())<<2|phase, benchMaxPayload)
	if err != nil {
		tb.Fatal(err)
	}
	b.msgs[i] = msgs
	for _, m := range msgs {
		b.bytes += len(m)
	}
}

// consume runs the receiving half in region i: decode, reassemble and
// merge every other region's report, and apply the gifts received.
func (b *benchRegions) consume(tb testing.TB, i int) {
	for j := range b.names {
		if j == i {
			continue
		}
		for _, m := range b.msgs[j] {
			p, err := b.codec.decode(m, Limits{})
			if err != nil {
				tb.Fatal(err)
			}
			r, err := b.asm[i].Add(b.now, p)
			if err != nil {
				tb.Fatal(err)
			}
			if r != nil {
				if err := b.states[i].Receive(b.now, *r); err != nil {
					tb.Fatal(err)
				}
				_ = b.states[i].Apply()
			}
		}
	}
}

// epoch runs one epoch of every region, both phases.
func (b *benchRegions) epoch(tb testing.TB) {
	b.now = b.now.Add(time.Second)
	b.bytes = 0
	for i := range b.names {
		b.tally(tb, i)
	}
	for i := range b.names {
		b.consume(tb, i)
	}
	for i := range b.names {
		b.produce(tb, i)
	}
	for i := range b.names {
		b.consume(tb, i)
	}
}

// BenchmarkEpoch100k is one sync epoch at 100,000 active global keys in each
// of three regions, both phases: per region, observe and close the tallies
// and encode the tally report; decode and merge the peers' tally reports;
// compute and commit the plan, build and encode the exchange report (split
// to 1 MiB messages); then decode, reassemble and merge the two peers'
// exchange reports and apply the gifts. ns/op and B/op are for all
// three regions; the custom metrics are per region and epoch. The
// sub-benchmarks run it with this package's codec and with the generated
// code's.
//
//	go test -run '^$' -bench Epoch100k -benchmem -benchtime 3x ./sync/codec
func BenchmarkEpoch100k(b *testing.B) {
	for _, c := range codecs {
		b.Run(c.name, func(b *testing.B) {
			br := newBenchRegions(b, 100_000, c.codec)
			for i := 0; i < 3; i++ { // every key enters its generation
				br.epoch(b)
			}
			b.ResetTimer()
			start := time.Now()
			var bytes int
			for i := 0; i < b.N; i++ {
				br.epoch(b)
				bytes += br.bytes
			}
			per := float64(b.N * len(br.names))
			b.ReportMetric(float64(time.Since(start).Milliseconds())/per, "ms/region-epoch")
			b.ReportMetric(float64(bytes)/per, "wire-B/region-epoch")
			b.ReportMetric(float64(len(br.msgs[0])), "msgs/report")
		})
	}
}

// BenchmarkEpochPhases splits the same epoch into its phases for one region
// (eu), at 100,000 keys: compute (observe, Tally, Epoch, Commit, Report),
// encode of its exchange report, decode (with reassembly) of a peer's, and
// merge (Receive) of it. Encode and decode run with this package's codec
// and with the generated code's; decodepart is decode without the
// reassembly, which copies every key once more.
func BenchmarkEpochPhases(b *testing.B) {
	br := newBenchRegions(b, 100_000, codecs[0].codec)
	for i := 0; i < 3; i++ {
		br.epoch(b)
	}
	const eu = 1
	st := br.states[eu]
	b.Run("compute", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			br.now = br.now.Add(time.Second)
			for k, key := range br.keys {
				st.Observe(key, br.demand[eu][k], br.demand[eu][k])
			}
			_ = st.Tally(br.now)
			p := st.Epoch(br.now)
			if err := st.Commit(p); err != nil {
				b.Fatal(err)
			}
			_ = st.Report()
		}
	})
	rep := st.Report()
	for _, c := range codecs {
		b.Run("encode/"+c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := c.encode(&rep, uint64(i), benchMaxPayload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	br.epoch(b)
	msgs := br.msgs[0] // ap's report, as eu receives it
	for _, c := range codecs {
		b.Run("decode/"+c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				a := NewAssembler(AssemblerConfig{})
				for _, m := range msgs {
					p, err := c.decode(m, Limits{})
					if err != nil {
						b.Fatal(err)
					}
					if _, err := a.Add(br.now, p); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
	for _, c := range codecs { // DecodePart alone, without reassembly
		b.Run("decodepart/"+c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				for _, m := range msgs {
					if _, err := c.decode(m, Limits{}); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
	var r region.Report // ap's report, for merge
	a := NewAssembler(AssemblerConfig{})
	for _, m := range msgs {
		p, err := DecodePart(m, Limits{})
		if err != nil {
			b.Fatal(err)
		}
		if rep, err := a.Add(br.now, p); err != nil {
			b.Fatal(err)
		} else if rep != nil {
			r = *rep
		}
	}
	b.Run("merge", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			r.Epoch++ // each merge is of a newer report
			if err := st.Receive(br.now, r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkEncodeSnapshot100k encodes the exchange state the holder
// persists every epoch, at 100,000 keys in their generations, with this
// package's encoder and with proto.Marshal.
func BenchmarkEncodeSnapshot100k(b *testing.B) {
	br := newBenchRegions(b, 100_000, codecs[0].codec)
	for i := 0; i < 3; i++ {
		br.epoch(b)
	}
	snap := br.states[1].Snapshot()
	for _, c := range []struct {
		name   string
		encode func(*region.Snapshot) ([]byte, error)
	}{{"ration", EncodeSnapshot}, {"baseline=generated", encodeSnapshotGenerated}} {
		b.Run(c.name, func(b *testing.B) {
			var n int
			for i := 0; i < b.N; i++ {
				blob, err := c.encode(&snap)
				if err != nil {
					b.Fatal(err)
				}
				n = len(blob)
			}
			b.ReportMetric(float64(n), "blob-B")
		})
	}
}

// BenchmarkEncodeSnapshotRecords100k encodes the same state as records,
// one a key, as sync/exchange's Redis coordinator persists it
// (EncodeSnapshotParts), beside the whole blob (baseline=whole).
func BenchmarkEncodeSnapshotRecords100k(b *testing.B) {
	br := newBenchRegions(b, 100_000, codecs[0].codec)
	for i := 0; i < 3; i++ {
		br.epoch(b)
	}
	snap := br.states[1].Snapshot()
	b.Run("ration", func(b *testing.B) {
		b.ReportAllocs()
		var n int
		for i := 0; i < b.N; i++ {
			head, recs, err := EncodeSnapshotParts(&snap)
			if err != nil {
				b.Fatal(err)
			}
			n = len(head)
			for _, r := range recs {
				n += len(r)
			}
		}
		b.ReportMetric(float64(n), "B")
	})
	b.Run("baseline=whole", func(b *testing.B) {
		b.ReportAllocs()
		var n int
		for i := 0; i < b.N; i++ {
			blob, err := EncodeSnapshot(&snap)
			if err != nil {
				b.Fatal(err)
			}
			n = len(blob)
		}
		b.ReportMetric(float64(n), "B")
	})
}
