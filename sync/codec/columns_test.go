package codec

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
	syncv1 "github.com/ration-dev/ration/sync/v1"
)

// partV2 marshals a hand-made part in a version 2 envelope.
func partV2(p *syncv1.Part) []byte {
	b := part(p)
	body, err := openEnvelope(b)
	if err != nil {
		panic(err)
	}
	return appendEnvelopeVersion(nil, body, V2)
}

// TestColumnsHostile feeds version 2 parts whose columns must be dropped,
// each for its reason, and compares each with the reference decoder.
func TestColumnsHostile(t *testing.T) {
	// One key "r/k" in generation 3 with rows [0 10] (eu, the sender's
	// own entry, left out), share 400,000 and demand 7.
	good := func() *syncv1.Part {
		p := header(5, 1, 0, 1, 1)
		p.KeyNameLens, p.KeyNames = []uint64{0, 3}, []byte("r/k")
		p.KeyFlags = []uint64{kRow | kGeneration | kShare | kDemand}
		p.KeyScalars = []uint64{6, 400_010 * 2, 7}
		p.KeyValues = []uint64{10}
		return p
	}
	msg := partV2(good())
	got, err := DecodePart(msg, Limits{})
	if err != nil {
		t.Fatalf("the good message: %v", err)
	}
	want := region.KeyReport{Key: "r/k", Generation: 3, Row: []int64{0, 10}, SharePPM: 400_000, Demand: 7, Granted: 7}
	if len(got.Keys) != 1 || fmt.Sprint(got.Keys[0]) != fmt.Sprint(want) || got.Version != V2 {
		t.Fatalf("the good message: got %+v (version %d), want %+v", got.Keys, got.Version, want)
	}
	sameDecode(t, msg, Limits{})
	for _, tc := range []struct {
		name  string
		spoil func(p *syncv1.Part)
		lim   Limits
		want  Reason
	}{
		{"a flag no version 2 knows", func(p *syncv1.Part) { p.KeyFlags[0] |= 1 << 14 }, Limits{}, ReasonCorrupt},
		{"a shape and a row flag", func(p *syncv1.Part) { p.KeyFlags[0] |= kShape }, Limits{}, ReasonCorrupt},
		{"a name sharing more than the previous", func(p *syncv1.Part) { p.KeyNameLens[0] = 1 }, Limits{}, ReasonCorrupt},
		{"a name longer than the names", func(p *syncv1.Part) { p.KeyNameLens[1] = 4 }, Limits{}, ReasonCorrupt},
		{"names left over", func(p *syncv1.Part) { p.KeyNames = append(p.KeyNames, 'x') }, Limits{}, ReasonCorrupt},
		{"a name not UTF-8", func(p *syncv1.Part) { p.KeyNames[2] = 0xff }, Limits{}, ReasonCorrupt},
		{"a name too long", func(p *syncv1.Part) {}, Limits{MaxKeyBytes: 2}, ReasonInconsistent},
		{"a value missing", func(p *syncv1.Part) { p.KeyValues = nil }, Limits{}, ReasonCorrupt},
		{"a value left over", func(p *syncv1.Part) { p.KeyValues = append(p.KeyValues, 1) }, Limits{}, ReasonCorrupt},
		{"a scalar missing", func(p *syncv1.Part) { p.KeyScalars = p.KeyScalars[:2] }, Limits{}, ReasonCorrupt},
		{"a name length missing", func(p *syncv1.Part) { p.KeyNameLens = p.KeyNameLens[:1] }, Limits{}, ReasonCorrupt},
		{"a length left over", func(p *syncv1.Part) { p.KeyLengths = []uint64{1} }, Limits{}, ReasonCorrupt},
		{"a shape beyond the values", func(p *syncv1.Part) {
			p.KeyFlags[0] = p.KeyFlags[0]&^kRow | kShape
			p.KeyLengths = []uint64{1 << 40, 0, 0, 0, 0, 0}
		}, Limits{}, ReasonCorrupt},
		{"exits beyond the lengths", func(p *syncv1.Part) {
			p.KeyFlags[0] |= kExits
			p.KeyLengths = []uint64{1 << 40}
		}, Limits{}, ReasonCorrupt},
		{"too many exits", func(p *syncv1.Part) {
			p.KeyFlags[0] |= kExits
			p.KeyLengths = []uint64{2, 0, 0, 0, 0, 0, 0, 0, 0}
			p.KeyScalars = append(p.KeyScalars, 0, 0)
		}, Limits{MaxExits: 1}, ReasonInconsistent},
		{"more keys than announced", func(p *syncv1.Part) {
			p.KeyFlags = append(p.KeyFlags, 0)
			p.KeyNameLens = append(p.KeyNameLens, 3, 0)
		}, Limits{}, ReasonInconsistent},
		{"columns without keys", func(p *syncv1.Part) { p.KeyFlags, p.KeysTotal = nil, 0 }, Limits{}, ReasonCorrupt},
		{"a version 1 key", func(p *syncv1.Part) { p.Keys = []*syncv1.Key{{Key: "a"}} }, Limits{}, ReasonInconsistent},
	} {
		p := good()
		tc.spoil(p)
		msg := partV2(p)
		_, err := DecodePart(msg, tc.lim)
		wantReason(t, tc.name, err, tc.want)
		sameDecode(t, msg, tc.lim)
	}
}

// TestColumnsSmaller checks what version 2 is for: a delta report's keys
// of one rule, with generations entered together and rows of three regions,
// take under a third of version 1's bytes.
func TestColumnsSmaller(t *testing.T) {
	r := region.Report{Region: "eu", Replica: "0", Epoch: 9, Exchange: true, Regions: []string{"ap", "eu", "us"}}
	for i := 0; i < 1000; i++ {
		row := []int64{int64(i * 377 % 400_000), 0, int64(i * 971 % 300_000)}
		in := []int64{int64(i * 613 % 500_000), 0, 0}
		base := int64(333_333)
		r.Keys = append(r.Keys, region.KeyReport{
			Key: fmt.Sprintf("per-tenant/tenant=%07d", i*37), Generation: 1_700_000_001, Base: base, Row: row, In: in,
			SharePPM: base - row[0] - row[2] + in[0], Demand: int64(i % 50), Granted: int64(i % 50),
		})
	}
	v1, _, err := SizeVersion(&r, 1, 1<<20, V1)
	if err != nil {
		t.Fatal(err)
	}
	v2, _, err := SizeVersion(&r, 1, 1<<20, V2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1,000 keys: %d bytes in version 1, %d in version 2 (%.2f×)", v1, v2, float64(v2)/float64(v1))
	if 3*v2 > v1 {
		t.Fatalf("version 2 took %d bytes, version 1 %d: want under a third", v2, v1)
	}
}

// TestSmallestVersion: a sender writes the version that makes a report
// smallest among those its peers read: V1 for a report of one key (the
// columns' framing costs more than they save), V2 for many, V1 whenever V2
// is not read; EncodeReport and Size agree with it.
func TestSmallestVersion(t *testing.T) {
	one := region.Report{Region: "eu", Replica: "0", Epoch: 9, Exchange: true, Regions: []string{"ap", "eu", "us"},
		Keys: []region.KeyReport{{Key: "r/tenant=acme", Generation: 77, Base: 333_333, Row: []int64{1_000, 0, 0}, SharePPM: 332_333, Demand: 40}}}
	many := one
	many.Keys = nil
	for i := 0; i < 100; i++ {
		many.Keys = append(many.Keys, region.KeyReport{Key: fmt.Sprintf("r/tenant=%05d", i), Generation: 77, Base: 333_333, Row: []int64{int64(i), 0, 0}, SharePPM: 333_333 - int64(i), Demand: 40})
	}
	for _, c := range []struct {
		name string
		r    *region.Report
		upTo Version
		want Version
	}{
		{"one key", &one, V2, V1},
		{"many keys", &many, V2, V2},
		{"many keys, V2 not read", &many, V1, V1},
	} {
		got, err := Smallest(c.r, 1, 1<<20, c.upTo)
		if err != nil || got != c.want {
			t.Errorf("%s: Smallest up to %d = %d, %v; want %d", c.name, c.upTo, got, err, c.want)
		}
		b1, _, _ := SizeVersion(c.r, 1, 1<<20, V1)
		b2, _, _ := SizeVersion(c.r, 1, 1<<20, V2)
		t.Logf("%s: %d B in V1, %d in V2", c.name, b1, b2)
		msgs, err := EncodeReportUpTo(c.r, 1, 1<<20, c.upTo)
		if err != nil {
			t.Fatal(err)
		}
		p, err := DecodePart(msgs[0], Limits{})
		if err != nil || p.Version != c.want {
			t.Errorf("%s: EncodeReportUpTo wrote version %d (%v), want %d", c.name, p.Version, err, c.want)
		}
	}
	bytes, _, err := Size(&one, 1, 1<<20)
	msgs, _ := EncodeReport(&one, 1, 1<<20)
	if err != nil || len(msgs) != 1 || bytes != len(msgs[0]) {
		t.Errorf("Size of one key = %d, %v; EncodeReport wrote %d messages", bytes, err, len(msgs))
	}
}

// TestColumnsSplitRestarts checks that each part's keys are written from a
// fresh start (the first name whole, differences from zero), so that a
// part decodes without the others: any one part alone gives its keys.
func TestColumnsSplitRestarts(t *testing.T) {
	r := region.Report{Region: "eu", Replica: "0", Epoch: 9, Regions: []string{"ap", "eu", "us"}}
	for i := 0; i < 400; i++ {
		r.Keys = append(r.Keys, region.KeyReport{Key: "rule/" + strings.Repeat("x", i%7) + fmt.Sprint(i), Generation: 77, Base: 5, Row: []int64{1, 0, 2}, SharePPM: 2})
	}
	msgs, err := EncodeReport(&r, 3, 600)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) < 3 {
		t.Fatalf("%d messages: the test wants several", len(msgs))
	}
	next := 0
	for i, m := range msgs {
		p, err := DecodePart(m, Limits{})
		if err != nil {
			t.Fatalf("message %d alone: %v", i, err)
		}
		for j, k := range p.Keys {
			if want := r.Keys[next+j]; fmt.Sprint(k) != fmt.Sprint(want) {
				t.Fatalf("message %d, key %d: got %+v, want %+v", i, j, k, want)
			}
		}
		next += len(p.Keys)
	}
}

// TestWriteVersion checks when a sender may write version 2: once every
// peer region has a replica heard lately, and every replica heard lately
// reads it.
func TestWriteVersion(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	a := NewAssembler(AssemblerConfig{})
	heard := func(region, replica string, epoch uint64, reads Version, at time.Time) {
		t.Helper()
		p := header(epoch, epoch, 0, 1, 0)
		p.Region, p.Replica, p.Reads = region, replica, uint32(reads)
		d, err := DecodePart(part(p), Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Add(at, d); err != nil {
			t.Fatal(err)
		}
	}
	peers := []string{"ap", "us"}
	const within = 3 * time.Second
	for _, step := range []struct {
		what string
		do   func()
		at   time.Duration
		want Version
	}{
		{"nobody heard", func() {}, 0, V1},
		{"ap heard, reads V2", func() { heard("ap", "0", 1, V2, now) }, 0, V1},
		{"us heard, reads V2", func() { heard("us", "0", 1, V2, now) }, 0, V2},
		{"an older replica of us starts", func() { heard("us", "1", 1, 0, now) }, 0, V1},
		{"it is upgraded", func() { heard("us", "1", 2, V2, now.Add(time.Second)) }, time.Second, V2},
		{"ap is not heard for long", func() {
			heard("us", "0", 5, V2, now.Add(4*time.Second))
			heard("us", "1", 5, V2, now.Add(4*time.Second))
		}, 4 * time.Second, V1},
	} {
		step.do()
		if got := a.WriteVersion(now.Add(step.at), peers, within); got != step.want {
			t.Fatalf("%s: got V%d, want V%d", step.what, got, step.want)
		}
	}
}

// TestDecodeAllocs checks that decoding a part allocates per part, not per
// key: a version 2 part of 2,000 keys in their generations no more than
// one of version 1.
func TestDecodeAllocs(t *testing.T) {
	r := region.Report{Region: "eu", Replica: "0", Epoch: 9, Exchange: true, Regions: []string{"ap", "eu", "us"}}
	for i := 0; i < 2000; i++ {
		r.Keys = append(r.Keys, region.KeyReport{Key: fmt.Sprintf("per-tenant/tenant=%07d", i), Generation: 5, Base: 7,
			Row: []int64{int64(i), 0, 3}, In: []int64{1, 0, int64(i)}, Tokens: []int64{0, 0, 1}, SharePPM: 9, Demand: 4})
	}
	allocs := map[Version]float64{}
	for _, v := range []Version{V1, V2} {
		msgs, err := EncodeReportVersion(&r, 1, 1<<20, v)
		if err != nil || len(msgs) != 1 {
			t.Fatalf("V%d: %d messages, %v", v, len(msgs), err)
		}
		allocs[v] = testing.AllocsPerRun(5, func() {
			if _, err := DecodePart(msgs[0], Limits{}); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Logf("allocations per part: V1 %v, V2 %v", allocs[V1], allocs[V2])
	if allocs[V2] > allocs[V1]+2 {
		t.Fatalf("V2 allocated %v times, V1 %v", allocs[V2], allocs[V1])
	}
}
