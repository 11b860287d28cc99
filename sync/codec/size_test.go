package codec

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ration-dev/ration/region"
)

// encodedSize is what Size must return: the messages of EncodeReport.
func encodedSize(r *region.Report, id uint64, maxBytes int) (bytes, msgs int, err error) {
	out, err := EncodeReport(r, id, maxBytes)
	for _, m := range out {
		bytes += len(m)
	}
	return bytes, len(out), err
}

// sameSize checks Size against EncodeReport on one report, in every
// version.
func sameSize(t *testing.T, what string, r *region.Report, id uint64, maxBytes int) {
	t.Helper()
	for _, v := range []Version{V1, V2, V3} {
		var wantBytes, wantMsgs int
		out, wantErr := EncodeReportVersion(r, id, maxBytes, v)
		for _, m := range out {
			wantBytes += len(m)
		}
		wantMsgs = len(out)
		gotBytes, gotMsgs, gotErr := SizeVersion(r, id, maxBytes, v)
		switch {
		case (gotErr == nil) != (wantErr == nil) || errors.Is(gotErr, ErrTooLarge) != errors.Is(wantErr, ErrTooLarge):
			t.Fatalf("%s, V%d: Size: got error %v, want %v", what, v, gotErr, wantErr)
		case gotBytes != wantBytes || gotMsgs != wantMsgs:
			t.Fatalf("%s, V%d: Size: got %d bytes in %d messages, want %d in %d", what, v, gotBytes, gotMsgs, wantBytes, wantMsgs)
		}
	}
}

// TestSizeMatchesEncode checks that Size counts exactly the bytes and
// messages of EncodeReport: random reports with and without exits, ids
// with and without the id field, message sizes from too small for the
// header to 1 MiB, so that reports split into one, a few, more than 16 and
// more than 128 parts (where the part index takes a second byte).
func TestSizeMatchesEncode(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 2))
	var errs, most int // of the reports below
	check := func(what string, r *region.Report, id uint64, maxBytes int) {
		sameSize(t, what, r, id, maxBytes)
		if _, n, err := Size(r, id, maxBytes); err != nil {
			errs++
		} else {
			most = max(most, n)
		}
	}
	for i := 0; i < 300; i++ {
		regions := []string{"ap", "eu", "us", "zz"}[:1+rng.IntN(4)]
		r := randomReport(rng, regions, rng.IntN(300), rng.IntN(2) == 0)
		id := rng.Uint64()
		if rng.IntN(4) == 0 {
			id = 0 // no report id field
		}
		maxBytes := []int{60, 200 + rng.IntN(800), 600 + rng.IntN(4000), 64 << 10, 1 << 20}[rng.IntN(5)]
		check("random report", &r, id, maxBytes)
	}
	// Random sizes reach more than 128 parts on most seeds, not all: these
	// reach it on every one, and fail for a message too small for a key.
	many := randomReport(rng, []string{"ap", "eu", "us"}, 3_000, true)
	check("3,000 keys in small messages", &many, rng.Uint64(), 1000)
	check("3,000 keys in too small messages", &many, rng.Uint64(), 60)
	if errs == 0 || most <= 128 {
		t.Fatalf("the reports made %d errors and at most %d parts: the test misses a case", errs, most)
	}
	big := randomReport(rng, []string{"ap", "eu", "us"}, 20_000, true)
	for _, maxBytes := range []int{1 << 20, 64 << 10, 8 << 10} {
		sameSize(t, "20,000 keys", &big, rng.Uint64(), maxBytes)
	}
}

// TestSizeErrors checks that Size fails where EncodeReport fails.
func TestSizeErrors(t *testing.T) {
	huge := region.Report{Region: "eu", Replica: "0", Keys: []region.KeyReport{{Key: strings.Repeat("k", 2000)}}}
	notUTF8 := region.Report{Region: "eu", Replica: "0", Keys: []region.KeyReport{{Key: "\xff"}}}
	for _, c := range []struct {
		what     string
		r        *region.Report
		maxBytes int
	}{
		{"a key larger than a message", &huge, 1000},
		{"a message smaller than the header", &huge, 10},
		{"a key that is not UTF-8", &notUTF8, 1 << 20},
	} {
		if _, _, err := Size(c.r, 1, c.maxBytes); err == nil {
			t.Errorf("%s: Size: got no error", c.what)
		}
		sameSize(t, c.what, c.r, 1, c.maxBytes)
	}
}

// TestSizeAllocs checks that Size allocates nothing for a report of a few
// parts: the simulator calls it for every report.
func TestSizeAllocs(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 3))
	r := randomReport(rng, []string{"ap", "eu", "us"}, 20_000, true)
	for _, v := range []Version{V1, V2, V3} {
		allocs := testing.AllocsPerRun(10, func() {
			if _, _, err := SizeVersion(&r, 1, 1<<20, v); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("V%d: Size allocated %v times, want 0", v, allocs)
		}
	}
}

// BenchmarkSize counts the bytes and messages of an exchange report of
// 20,000 keys in their generations, with Size and by encoding it.
//
//	go test -run '^$' -bench Size -benchmem ./sync/codec
func BenchmarkSize(b *testing.B) {
	br := newBenchRegions(b, 20_000, codecs[0].codec)
	for i := 0; i < 3; i++ {
		br.epoch(b)
	}
	rep := br.states[1].Report()
	sizeV1 := func(r *region.Report, id uint64, maxBytes int) (int, int, error) {
		return SizeVersion(r, id, maxBytes, V1)
	}
	for _, c := range []struct {
		name string
		size func(*region.Report, uint64, int) (int, int, error)
	}{{"ration", Size}, {"baseline=EncodeReport", encodedSize}, {"baseline=V1", sizeV1}} {
		b.Run(c.name, func(b *testing.B) {
			var n int
			for i := 0; i < b.N; i++ {
				bytes, _, err := c.size(&rep, uint64(i), benchMaxPayload)
				if err != nil {
					b.Fatal(err)
				}
				n = bytes
			}
			b.ReportMetric(float64(n), "wire-B")
		})
	}
}
