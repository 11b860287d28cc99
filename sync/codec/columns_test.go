package codec

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
	v3, _, err := SizeVersion(&r, 1, 1<<20, V3)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1,000 keys: %d bytes in version 1, %d in version 2 (%.2f×), %d in version 3 (%.2f× of version 2)",
		v1, v2, float64(v2)/float64(v1), v3, float64(v3)/float64(v2))
	if 3*v2 > v1 {
		t.Fatalf("version 2 took %d bytes, version 1 %d: want under a third", v2, v1)
	}
	// Version 3 writes each name after the first as a step of its id (37,
	// one byte) instead of two lengths and the digits that differ.
	if want := v2 - 999*3; v3 > want {
		t.Fatalf("version 3 took %d bytes, version 2 %d: want at most %d", v3, v2, want)
	}
}

// TestSmallestVersion: a sender writes the version that makes a report
// smallest among those its peers read: V1 for a report of one key (the
// columns' framing costs more than they save), V3 for many, V2 whenever V3
// is not read or its flags cost more than its steps save, V1 whenever V2 is
// not read; EncodeReport and Size agree with it.
func TestSmallestVersion(t *testing.T) {
	one := region.Report{Region: "eu", Replica: "0", Epoch: 9, Exchange: true, Regions: []string{"ap", "eu", "us"},
		Keys: []region.KeyReport{{Key: "r/tenant=acme", Generation: 77, Base: 333_333, Row: []int64{1_000, 0, 0}, SharePPM: 332_333, Demand: 40}}}
	many := one
	many.Keys = nil
	for i := 0; i < 100; i++ {
		many.Keys = append(many.Keys, region.KeyReport{Key: fmt.Sprintf("r/tenant=%05d", i), Generation: 77, Base: 333_333, Row: []int64{int64(i), 0, 0}, SharePPM: 333_333 - int64(i), Demand: 40})
	}
	// Names without a number, and a base of each key's own: V3's flags of
	// kBase take a byte more than V2's, and it has no step to make up.
	bases := many
	bases.Keys = nil
	for i := 0; i < 100; i++ {
		bases.Keys = append(bases.Keys, region.KeyReport{Key: fmt.Sprintf("r/tenant=%c%c", 'a'+i%26, 'a'+i/26), Generation: 77, Base: 333_333 - 100*int64(i), Row: []int64{int64(i), 0, 0}, SharePPM: 333_333 - 101*int64(i), Demand: 40})
	}
	for _, c := range []struct {
		name string
		r    *region.Report
		upTo Version
		want Version
	}{
		{"one key", &one, V3, V1},
		{"many keys", &many, V3, V3},
		{"many keys, V3 not read", &many, V2, V2},
		{"many keys, V2 not read", &many, V1, V1},
		{"bases that differ", &bases, V3, V2},
	} {
		got, err := Smallest(c.r, 1, 1<<20, c.upTo)
		if err != nil || got != c.want {
			t.Errorf("%s: Smallest up to %d = %d, %v; want %d", c.name, c.upTo, got, err, c.want)
		}
		b1, _, _ := SizeVersion(c.r, 1, 1<<20, V1)
		b2, _, _ := SizeVersion(c.r, 1, 1<<20, V2)
		b3, _, _ := SizeVersion(c.r, 1, 1<<20, V3)
		t.Logf("%s: %d B in V1, %d in V2, %d in V3", c.name, b1, b2, b3)
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

// TestWriteVersion checks when a sender may write version 2 or 3: once every
// peer region has a replica heard lately, and every replica heard lately
// reads it; the newest that all of them read.
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
		{"ap is heard, upgraded to V3", func() { heard("ap", "0", 6, V3, now.Add(5*time.Second)) }, 5 * time.Second, V2},
		{"us's replicas are upgraded to V3", func() {
			heard("us", "0", 7, V3, now.Add(6*time.Second))
			heard("us", "1", 7, V3, now.Add(6*time.Second))
		}, 6 * time.Second, V3},
		{"a replica of us rolls back to V2", func() { heard("us", "1", 8, V2, now.Add(7*time.Second)) }, 7 * time.Second, V2},
	} {
		step.do()
		if got := a.WriteVersion(now.Add(step.at), peers, within); got != step.want {
			t.Fatalf("%s: got V%d, want V%d", step.what, got, step.want)
		}
	}
}

// TestDecodeAllocs checks that decoding a part allocates per part, not per
// key: a version 2 or 3 part of 2,000 keys in their generations no more
// than one of version 1.
func TestDecodeAllocs(t *testing.T) {
	r := region.Report{Region: "eu", Replica: "0", Epoch: 9, Exchange: true, Regions: []string{"ap", "eu", "us"}}
	for i := 0; i < 2000; i++ {
		r.Keys = append(r.Keys, region.KeyReport{Key: fmt.Sprintf("per-tenant/tenant=%07d", i), Generation: 5, Base: 7,
			Row: []int64{int64(i), 0, 3}, In: []int64{1, 0, int64(i)}, Tokens: []int64{0, 0, 1}, SharePPM: 9, Demand: 4})
	}
	allocs := map[Version]float64{}
	for _, v := range []Version{V1, V2, V3} {
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
	t.Logf("allocations per part: V1 %v, V2 %v, V3 %v", allocs[V1], allocs[V2], allocs[V3])
	for _, v := range []Version{V2, V3} {
		if allocs[v] > allocs[V1]+2 {
			t.Fatalf("V%d allocated %v times, V1 %v", v, allocs[v], allocs[V1])
		}
	}
}

// TestColumnsHostileV3 feeds version 3 parts whose steps of names, sparse
// rows or flags must be dropped, and compares each with the reference
// decoder.
func TestColumnsHostileV3(t *testing.T) {
	// "u=098" (demand 7), then "u=099" as a step of +1 (code 0), "u=097"
	// as one of -2 (code 3), in generation 3 with Row [5 0 0] and In
	// [0 0 0] from eu among ap, eu and us (sparse: the head 5<<2 | 1, then
	// 0); shares written from PPM/3 and from what the rows add up to.
	const step = 1 << 2 // kStep's wire bit
	good := func() *syncv1.Part {
		p := header(5, 1, 0, 3, 3)
		p.Regions = []string{"ap", "eu", "us"}
		p.KeyNameLens, p.KeyNames = []uint64{0, 5, 0, 3}, []byte("u=098")
		p.KeyFlags = []uint64{kDemand, kDemand | step, step | kGeneration | kRow | kIn}
		p.KeyScalars = []uint64{7, 8, 6}
		p.KeyValues = []uint64{5<<2 | 1, 0}
		return p
	}
	v3 := func(p *syncv1.Part) []byte {
		body, err := openEnvelope(part(p))
		if err != nil {
			t.Fatal(err)
		}
		return appendEnvelopeVersion(nil, body, V3)
	}
	msg := v3(good())
	got, err := DecodePart(msg, Limits{})
	if err != nil {
		t.Fatalf("the good message: %v", err)
	}
	want := []region.KeyReport{
		{Key: "u=098", SharePPM: 333_333, Demand: 7, Granted: 7},
		{Key: "u=099", SharePPM: 333_333, Demand: 8, Granted: 8},
		{Key: "u=097", Generation: 3, Row: []int64{5, 0, 0}, In: []int64{0, 0, 0}, SharePPM: -5},
	}
	if fmt.Sprint(got.Keys) != fmt.Sprint(want) || got.Version != V3 {
		t.Fatalf("the good message: got %+v (version %d), want %+v", got.Keys, got.Version, want)
	}
	sameDecode(t, msg, Limits{})
	for _, tc := range []struct {
		name  string
		spoil func(p *syncv1.Part)
	}{
		{"a flag no version 3 knows", func(p *syncv1.Part) { p.KeyFlags[0] |= 1 << 15 }},
		{"a step first", func(p *syncv1.Part) { p.KeyFlags[0] |= step }},
		{"a step past the digits", func(p *syncv1.Part) { p.KeyNameLens[2] = 2 * 901 }},
		{"a step below zero", func(p *syncv1.Part) { p.KeyNameLens[3] = 2*100 - 1 }},
		{"the largest step", func(p *syncv1.Part) { p.KeyNameLens[2] = 1<<64 - 2 }},
		{"the smallest step", func(p *syncv1.Part) { p.KeyNameLens[2] = 1<<64 - 1 }},
		{"a step after a name without digits", func(p *syncv1.Part) { p.KeyNames[4] = 'x' }},
		{"a step missing", func(p *syncv1.Part) { p.KeyNameLens = p.KeyNameLens[:3] }},
		// Sparse rows (two entries besides eu's, so a mask of two bits):
		// u=097's Row [5, 0] is the head 5<<2 | 1, its In [0, 0] a 0.
		{"a sparse row missing", func(p *syncv1.Part) { p.KeyValues = p.KeyValues[:1] }},
		{"a sparse row left over", func(p *syncv1.Part) { p.KeyValues = append(p.KeyValues, 0) }},
		{"a head without a mask", func(p *syncv1.Part) { p.KeyValues[1] = 4 }},
		{"a mask whose first entry is 0", func(p *syncv1.Part) { p.KeyValues[0] = 1 }},
		{"a second entry missing", func(p *syncv1.Part) { p.KeyValues[0] = 5<<2 | 3 }},
		{"a second entry 0", func(p *syncv1.Part) {
			p.KeyValues = []uint64{5<<2 | 3, 0, 0}
		}},
	} {
		p := good()
		tc.spoil(p)
		msg := v3(p)
		_, err := DecodePart(msg, Limits{})
		wantReason(t, tc.name, err, ReasonCorrupt)
		sameDecode(t, msg, Limits{})
	}
	// Steps to the edges, accepted: 098 + 901 = 999, 999 - 999 = 000.
	p := good()
	p.KeyNameLens[2], p.KeyNameLens[3] = 2*900, 2*999-1
	msg = v3(p)
	got, err = DecodePart(msg, Limits{})
	if err != nil || got.Keys[1].Key != "u=999" || got.Keys[2].Key != "u=000" {
		t.Fatalf("steps to the edges: got %v, %v", got, err)
	}
	sameDecode(t, msg, Limits{})
}

// TestMixedVersions runs a rolling upgrade from version 2 to 3: while a
// peer's replica reads only version 2, a sender writes it what that
// release decodes (version 2, byte for byte the reference encoder's, whose
// envelope check it passes); once every replica heard reads version 3, the
// sender writes version 3, which the release before would drop (reason
// version), and which decodes to the same report.
func TestMixedVersions(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	r := region.Report{Region: "ap", Replica: "0", Epoch: 9, Exchange: true, Regions: []string{"ap", "eu", "us"}}
	for i := 0; i < 300; i++ {
		r.Keys = append(r.Keys, region.KeyReport{Key: fmt.Sprintf("per-user/user=%07d", i*97), Generation: 1_700_000_001, Base: 333_334,
			Row: []int64{0, int64(i * 31), 0}, SharePPM: 333_334 - int64(i*31), Demand: int64(i)})
	}
	// decodeV2 is the release before: it reads versions 1 and 2 only.
	decodeV2 := func(msg []byte) (*Part, error) {
		p, err := DecodePart(msg, Limits{})
		if err == nil && p.Version > V2 {
			return nil, drop(ReasonVersion, "envelope version %d, want %d or %d", p.Version, V1, V2)
		}
		return p, err
	}
	a := NewAssembler(AssemblerConfig{})
	heard := func(region string, epoch uint64, reads Version) {
		t.Helper()
		p := header(epoch, epoch, 0, 1, 0)
		p.Region, p.Replica = region, "0"
		d, err := DecodePart(part(p), Limits{})
		if err != nil {
			t.Fatal(err)
		}
		d.Reads = reads // what its release says it reads
		if _, err := a.Add(now, d); err != nil {
			t.Fatal(err)
		}
	}
	heard("eu", 1, V2)
	heard("us", 1, V3)
	peers := []string{"eu", "us"}
	v := a.WriteVersion(now, peers, time.Second)
	if v != V2 {
		t.Fatalf("with eu reading version 2: WriteVersion = %d, want 2", v)
	}
	msgs, err := EncodeReportUpTo(&r, 7, 1<<20, v)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := encodeReportGeneratedV2(&r, 7, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != len(ref) {
		t.Fatalf("%d messages, the reference %d", len(msgs), len(ref))
	}
	for i, m := range msgs {
		if string(m) != string(ref[i]) {
			t.Fatalf("message %d is not version 2 as the reference writes it", i)
		}
		p, err := decodeV2(m)
		if err != nil || p.Version != V2 {
			t.Fatalf("message %d: the release before decodes version %v, %v", i, p, err)
		}
	}
	v2bytes := len(msgs[0])
	heard("eu", 2, V3)
	if v = a.WriteVersion(now, peers, time.Second); v != V3 {
		t.Fatalf("every replica reading version 3: WriteVersion = %d, want 3", v)
	}
	msgs, err = EncodeReportUpTo(&r, 7, 1<<20, v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodeV2(msgs[0]); err == nil {
		t.Fatal("the release before decoded version 3")
	} else {
		wantReason(t, "version 3 in the release before", err, ReasonVersion)
	}
	got := decodeAll(t, NewAssembler(AssemblerConfig{}), now, msgs)
	if diff := cmp.Diff(&r, got); diff != "" {
		t.Fatalf("version 3 (-want +got):\n%s", diff)
	}
	t.Logf("300 keys: %d B in version 2, %d in version 3", v2bytes, len(msgs[0]))
}
