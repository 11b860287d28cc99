package codec

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ration-dev/ration/region"
	syncv1 "github.com/ration-dev/ration/sync/v1"
)

// randomReports returns reports of every shape the codec tests use: from
// randomReport (nil and full rows, exits) and from fill (every field set).
func randomReports(t *testing.T, rng *rand.Rand, n int) []region.Report {
	t.Helper()
	var reps []region.Report
	for i := 0; i < n; i++ {
		if i%4 == 3 {
			var r region.Report
			fill(t, rng, reflect.ValueOf(&r).Elem(), "Report")
			reps = append(reps, r)
			continue
		}
		regions := []string{"ap", "eu", "us", "zz"}[:1+rng.IntN(4)]
		reps = append(reps, randomReport(rng, regions, rng.IntN(60), rng.IntN(2) == 0))
	}
	return reps
}

// assemble decodes msgs with decode and returns the report they make.
func assemble(t *testing.T, decode func([]byte, Limits) (*Part, error), msgs [][]byte) *region.Report {
	t.Helper()
	a := NewAssembler(AssemblerConfig{})
	var got *region.Report
	for i, m := range msgs {
		p, err := decode(m, Limits{})
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		r, err := a.Add(time.Unix(1_700_000_000, 0), p)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if r != nil {
			got = r
		}
	}
	if got == nil {
		t.Fatalf("%d messages did not complete a report", len(msgs))
	}
	return got
}

// generated are the reference encoders of each version, through the
// generated code.
var generated = []struct {
	v      Version
	encode func(r *region.Report, id uint64, maxBytes int) ([][]byte, error)
}{{V1, encodeReportGenerated}, {V2, encodeReportGeneratedV2}, {V3, encodeReportGeneratedV3}}

// TestCodecMatchesGenerated checks the hand-written codec against the
// generated code in both directions, in every version: EncodeReportVersion
// writes the same bytes as proto.Marshal (with the naive columns of V2),
// the generated encoding decodes with DecodePart, and EncodeReportVersion's
// decodes with proto.Unmarshal, all to the report encoded.
func TestCodecMatchesGenerated(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 4))
	for i, want := range randomReports(t, rng, 200) {
		max := 600 + rng.IntN(4000)
		id := rng.Uint64()
		if rng.IntN(8) == 0 {
			id = 0
		}
		for _, g := range generated {
			ours, err := EncodeReportVersion(&want, id, max, g.v)
			gen, genErr := g.encode(&want, id, max)
			if errors.Is(err, ErrTooLarge) && errors.Is(genErr, ErrTooLarge) {
				// A random entry larger than a random small message: both
				// refuse it alike (a run drew one now and then, and failed).
				continue
			}
			if err != nil {
				t.Fatalf("report %d, V%d: EncodeReport: %v", i, g.v, err)
			}
			if genErr != nil {
				t.Fatalf("report %d, V%d: the generated encoder: %v", i, g.v, genErr)
			}
			if len(ours) != len(gen) {
				t.Fatalf("report %d, V%d: got %d messages, want %d", i, g.v, len(ours), len(gen))
			}
			for j := range ours {
				if !bytes.Equal(ours[j], gen[j]) {
					t.Fatalf("report %d, V%d, message %d: got\n%x\nwant (proto.Marshal)\n%x", i, g.v, j, ours[j], gen[j])
				}
			}
			if diff := cmp.Diff(&want, assemble(t, DecodePart, gen)); diff != "" {
				t.Fatalf("report %d, V%d: generated encoding, DecodePart (-want +got):\n%s", i, g.v, diff)
			}
			if diff := cmp.Diff(&want, assemble(t, decodePartGenerated, ours)); diff != "" {
				t.Fatalf("report %d, V%d: EncodeReport, generated decoding (-want +got):\n%s", i, g.v, diff)
			}
		}
	}
}

func TestEncodeRejectsInvalidUTF8(t *testing.T) {
	r := region.Report{Region: "eu", Replica: "0", Keys: []region.KeyReport{{Key: "r/\xff"}}}
	for _, v := range []Version{V1, V2, V3} {
		if _, err := EncodeReportVersion(&r, 1, 1<<20, v); err == nil {
			t.Fatalf("V%d: got no error for a key that is not UTF-8, want one (receivers would drop the part)", v)
		}
	}
	if _, err := encodeReportGenerated(&r, 1, 1<<20); err == nil {
		t.Fatalf("the generated encoder accepted it: the test is wrong")
	}
}

// sameDecode checks that DecodePart and the generated decoder agree on msg:
// both drop it for the same reason (and with the same detail, unless the
// body does not parse), or both return the same Part.
func sameDecode(t *testing.T, msg []byte, lim Limits) {
	t.Helper()
	got, gotErr := DecodePart(msg, lim)
	want, wantErr := decodePartGenerated(msg, lim)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("DecodePart: got error %v, want %v (the generated decoder's)", gotErr, wantErr)
	}
	if wantErr != nil {
		g, _ := ReasonOf(gotErr)
		w, _ := ReasonOf(wantErr)
		if g != w || (w != ReasonCorrupt && gotErr.Error() != wantErr.Error()) {
			t.Fatalf("DecodePart: got error %v, want %v", gotErr, wantErr)
		}
		return
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("DecodePart (-generated +ours):\n%s", diff)
	}
}

// scrambler writes Part messages the way other proto3 encoders may: fields
// in any order, scalars repeated (the last counts), repeated scalars packed,
// unpacked or split, varints longer than they need be, and unknown fields of
// every wire type, including known numbers with another wire type.
type scrambler struct{ rng *rand.Rand }

// field is one field's encodings, in the order they must keep.
type field [][]byte

// merge interleaves the fields at random, each in its own order.
func (s scrambler) merge(fs []field) []byte {
	for range s.rng.IntN(3) {
		fs = append(fs, s.unknown())
	}
	var b []byte
	for {
		live := fs[:0]
		for _, f := range fs {
			if len(f) > 0 {
				live = append(live, f)
			}
		}
		if len(live) == 0 {
			return b
		}
		fs = live
		i := s.rng.IntN(len(fs))
		b = append(b, fs[i][0]...)
		fs[i] = fs[i][1:]
	}
}

func (s scrambler) varint(b []byte, v uint64) []byte {
	n := protowire.SizeVarint(v)
	if s.rng.IntN(8) == 0 {
		n += s.rng.IntN(11 - n)
	}
	for i := 0; i < n-1; i++ {
		b = append(b, byte(v&0x7f)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func (s scrambler) tag(num protowire.Number, typ protowire.Type) []byte {
	return s.varint(nil, protowire.EncodeTag(num, typ))
}

// scalar is a varint field, after a decoy value or two.
func (s scrambler) scalar(num protowire.Number, v uint64) field {
	var f field
	for range s.rng.IntN(3) {
		f = append(f, s.varint(s.tag(num, protowire.VarintType), s.rng.Uint64()>>s.rng.IntN(64)))
	}
	if v != 0 || len(f) > 0 || s.rng.IntN(4) == 0 {
		f = append(f, s.varint(s.tag(num, protowire.VarintType), v))
	}
	return f
}

func (s scrambler) bytes(num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(s.tag(num, protowire.BytesType), v)
}

// str is a string field; decoy says whether earlier values may come first
// (not for repeated strings, where each counts).
func (s scrambler) str(num protowire.Number, v string, decoy bool) field {
	var f field
	for decoy && s.rng.IntN(4) == 0 {
		f = append(f, s.bytes(num, []byte("decoy")))
	}
	if v != "" || len(f) > 0 || !decoy || s.rng.IntN(4) == 0 {
		f = append(f, s.bytes(num, []byte(v)))
	}
	return f
}

// ints is a repeated varint field in chunks, each packed or not.
func ints[T int64 | uint64](s scrambler, num protowire.Number, v []T) field {
	var f field
	for len(v) > 0 || s.rng.IntN(8) == 0 {
		n := min(len(v), 1+s.rng.IntN(4))
		if s.rng.IntN(2) == 0 {
			var p []byte
			for _, x := range v[:n] {
				p = s.varint(p, uint64(x))
			}
			f = append(f, s.bytes(num, p))
		} else {
			for _, x := range v[:n] {
				f = append(f, s.varint(s.tag(num, protowire.VarintType), uint64(x)))
			}
		}
		v = v[n:]
	}
	return f
}

// unknown is a field the decoder must skip.
func (s scrambler) unknown() field {
	num := protowire.Number(1 + s.rng.IntN(30))
	switch s.rng.IntN(6) {
	case 0:
		return field{protowire.AppendFixed32(s.tag(num, protowire.Fixed32Type), s.rng.Uint32())}
	case 1:
		if num == fRuleFingerprint {
			num += 100 // RuleDef's fingerprint is a fixed64 of that number: not unknown
		}
		return field{protowire.AppendFixed64(s.tag(num, protowire.Fixed64Type), s.rng.Uint64())}
	case 2:
		g := s.tag(num, protowire.StartGroupType)
		g = s.varint(append(g, s.tag(num+1, protowire.VarintType)...), 7)
		return field{append(g, s.tag(num, protowire.EndGroupType)...)}
	case 3:
		// A varint under a message's number (11 in Part and Key; unused in
		// Exit): unknown to a proto3 parser, not an error.
		return field{s.varint(s.tag(fPartKeys, protowire.VarintType), 1)}
	case 4:
		big := protowire.MaxValidNumber - protowire.Number(s.rng.IntN(3))
		return field{s.varint(s.tag(big, protowire.VarintType), s.rng.Uint64())}
	}
	return field{s.bytes(num+100, []byte{0xff, 0x01})} // not UTF-8, and unread
}

func (s scrambler) exit(x *syncv1.Exit) []byte {
	return s.merge([]field{
		s.scalar(fExitGeneration, x.Generation),
		ints(s, fExitRow, x.Row), ints(s, fExitTaken, x.Taken), ints(s, fExitIn, x.In), ints(s, fExitInTaken, x.InTaken),
	})
}

func (s scrambler) key(k *syncv1.Key) []byte {
	fs := []field{
		s.str(fKeyKey, k.Key, true), s.scalar(fKeyGeneration, k.Generation), s.scalar(fKeyBase, protowire.EncodeZigZag(k.Base)),
		ints(s, fKeyRow, k.Row), ints(s, fKeyTaken, k.Taken), ints(s, fKeyIn, k.In), ints(s, fKeyInTaken, k.InTaken),
		s.scalar(fKeySharePPM, uint64(k.SharePpm)), s.scalar(fKeyDemand, uint64(k.Demand)), s.scalar(fKeyGranted, uint64(k.Granted)),
		ints(s, fKeySettled, k.Settled), ints(s, fKeyTokens, k.Tokens), s.scalar(fKeyTokensWin, uint64(k.TokensWindow)),
	}
	var exits field
	for _, x := range k.Exits {
		exits = append(exits, s.bytes(fKeyExits, s.exit(x)))
	}
	return s.merge(append(fs, exits))
}

func (s scrambler) rule(d *syncv1.RuleDef) []byte {
	var fp field
	if d.Fingerprint != 0 || s.rng.IntN(4) == 0 {
		fp = field{protowire.AppendFixed64(s.tag(fRuleFingerprint, protowire.Fixed64Type), d.Fingerprint)}
	}
	return s.merge([]field{
		s.str(fRuleName, d.Name, true), fp, s.scalar(fRuleFixedWindow, b2u(d.FixedWindow)),
		s.scalar(fRuleLimit, uint64(d.Limit)), s.scalar(fRulePeriod, uint64(d.PeriodNs)),
		s.scalar(fRuleBurst, uint64(d.Burst)), s.scalar(fRuleCost, uint64(d.Cost)),
	})
}

func (s scrambler) part(p *syncv1.Part) []byte {
	fs := []field{
		s.str(fPartRegion, p.Region, true), s.str(fPartReplica, p.Replica, true),
		s.scalar(fPartEpoch, p.Epoch), s.scalar(fPartSentAt, uint64(p.SentAtUnixNano)), s.scalar(fPartExchange, b2u(p.Exchange)),
		s.scalar(fPartPart, uint64(p.Part)), s.scalar(fPartParts, uint64(p.Parts)), s.scalar(fPartKeysTotal, uint64(p.KeysTotal)),
		s.scalar(fPartRefresh, uint64(p.Refresh)), s.scalar(fPartRefFrom, uint64(p.RefreshFrom)), s.scalar(fPartRefCount, uint64(p.RefreshCount)),
		s.scalar(fPartSince, p.Since), s.scalar(fPartPrev, p.Prev), s.scalar(fPartResent, p.Resent),
	}
	if p.ReportId != 0 || s.rng.IntN(2) == 0 {
		fs = append(fs, field{protowire.AppendFixed64(s.tag(fPartReportID, protowire.Fixed64Type), p.ReportId)})
	}
	var regions, keys field
	for _, r := range p.Regions {
		regions = append(regions, s.str(fPartRegions, r, false)...)
	}
	for _, r := range p.Resend {
		regions = append(regions, s.str(fPartResend, r, false)...)
	}
	for _, k := range p.Keys {
		keys = append(keys, s.bytes(fPartKeys, s.key(k)))
	}
	fs = append(fs, s.str(fPartPolicy, p.Policy, true), s.scalar(fPartReads, uint64(p.Reads)))
	if len(p.KeyFlags) > 0 {
		fs = append(fs, ints(s, fColNameLens, p.KeyNameLens), s.str(fColNames, string(p.KeyNames), true),
			ints(s, fColFlags, p.KeyFlags), ints(s, fColScalars, p.KeyScalars), ints(s, fColValues, p.KeyValues),
			ints(s, fColLengths, p.KeyLengths))
	}
	var rules field
	for _, d := range p.Rules {
		rules = append(rules, s.bytes(fPartRules, s.rule(d)))
	}
	return s.merge(append(fs, regions, keys, rules))
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// TestDecodeScrambled decodes random reports written as other encoders may
// write them, in every version: DecodePart must agree with the generated
// decoder, and both with the report encoded.
func TestDecodeScrambled(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 5))
	s := scrambler{rng}
	for i, want := range randomReports(t, rng, 300) {
		g := generated[i%2]
		msgs, err := g.encode(&want, rng.Uint64(), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		body, v, err := openEnvelopeVersion(msgs[0])
		if err != nil {
			t.Fatal(err)
		}
		var pb syncv1.Part
		if err := proto.Unmarshal(body, &pb); err != nil {
			t.Fatal(err)
		}
		msg := appendEnvelopeVersion(nil, s.part(&pb), v)
		sameDecode(t, msg, Limits{})
		got, err := DecodePart(msg, Limits{})
		if err != nil {
			t.Fatalf("report %d, V%d: %v", i, v, err)
		}
		r := got.Header
		r.Keys = got.Keys
		if diff := cmp.Diff(&want, &r); diff != "" {
			t.Fatalf("report %d, V%d (-want +got):\n%s", i, v, diff)
		}
	}
}

// TestDecodeMatchesGeneratedOnDamage damages good messages in every way a
// byte can be damaged, inside a valid envelope so that the part decoder
// sees it, and with tight Limits so that every check is reached: DecodePart
// must drop what the generated decoder drops, for the same reason.
func TestDecodeMatchesGeneratedOnDamage(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 6))
	tight := Limits{MaxParts: 2, MaxKeys: 8, MaxNameBytes: 3, MaxKeyBytes: 12, MaxExits: 1}
	for i, want := range randomReports(t, rng, 80) {
		want.Keys = want.Keys[:min(len(want.Keys), 6)]
		msgs, err := generated[i%2].encode(&want, rng.Uint64(), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		body, v, err := openEnvelopeVersion(msgs[0])
		if err != nil {
			t.Fatal(err)
		}
		for range 200 {
			b := append([]byte(nil), body...)
			switch i := rng.IntN(len(b) + 1); rng.IntN(4) {
			case 0:
				b = b[:i]
			case 1:
				if i < len(b) {
					b[i] ^= 1 << rng.IntN(8)
				}
			case 2:
				if i < len(b) {
					b[i] = byte(rng.IntN(256))
				}
			case 3:
				b = append(b[:i], append([]byte{byte(rng.IntN(256))}, b[i:]...)...)
			}
			msg := appendEnvelopeVersion(nil, b, v)
			sameDecode(t, msg, Limits{})
			sameDecode(t, msg, tight)
		}
	}
}

// TestDecodeWireEdges are the wire-format cases a parser most often gets
// wrong, each compared with the generated decoder.
func TestDecodeWireEdges(t *testing.T) {
	hdr := part(header(5, 1, 0, 1, 1))
	body, err := openEnvelope(hdr)
	if err != nil {
		t.Fatal(err)
	}
	key := func(fields ...[]byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, fPartKeys, protowire.BytesType), bytes.Join(fields, nil))
	}
	tag := func(num protowire.Number, typ protowire.Type) []byte { return protowire.AppendTag(nil, num, typ) }
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, tc := range []struct {
		name string
		tail []byte
	}{
		{"field number 0", []byte{0x00, 0x00}},
		{"largest field number", cat(tag(protowire.MaxValidNumber, protowire.VarintType), []byte{1})},
		{"field number beyond the largest", cat(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3), []byte{1})},
		{"wire type 6", []byte{0x7e, 0x01}},
		{"wire type 7", []byte{0x7f, 0x01}},
		{"end group alone", tag(20, protowire.EndGroupType)},
		{"unclosed group", cat(tag(20, protowire.StartGroupType), tag(21, protowire.VarintType), []byte{1})},
		{"group closed by another number", cat(tag(20, protowire.StartGroupType), tag(21, protowire.EndGroupType))},
		{"known field as a group", cat(tag(fPartKeys, protowire.StartGroupType), tag(fPartKeys, protowire.EndGroupType))},
		{"varint of 11 bytes", cat(tag(fPartEpoch, protowire.VarintType), bytes.Repeat([]byte{0xff}, 10), []byte{0x01})},
		{"varint overflowing 64 bits", cat(tag(fPartEpoch, protowire.VarintType), bytes.Repeat([]byte{0xff}, 9), []byte{0x02})},
		{"varint padded to 10 bytes", cat(tag(fPartEpoch, protowire.VarintType), bytes.Repeat([]byte{0x80}, 9), []byte{0x00})},
		{"length beyond the end", cat(tag(fPartRegions, protowire.BytesType), []byte{0x05, 'a'})},
		{"invalid UTF-8 region", cat(tag(fPartRegions, protowire.BytesType), []byte{0x01, 0xff})},
		{"invalid UTF-8 in an unknown field", cat(tag(40, protowire.BytesType), []byte{0x01, 0xff})},
		{"invalid UTF-8 key", key(tag(fKeyKey, protowire.BytesType), []byte{0x01, 0xff})},
		{"empty key message", key()},
		{"packed row ending inside a varint", key(tag(fKeyRow, protowire.BytesType), []byte{0x02, 0x01, 0x80})},
		{"empty packed row", key(tag(fKeyRow, protowire.BytesType), []byte{0x00})},
		{"row as fixed64", key(cat(tag(fKeyRow, protowire.Fixed64Type), make([]byte, 8)))},
		{"negative row, unpacked", key(tag(fKeyRow, protowire.VarintType), protowire.AppendVarint(nil, uint64(1<<64-3)))},
		{"key with an end group", key(tag(fKeyKey, protowire.EndGroupType))},
		{"exit ending inside a field", key(tag(fKeyExits, protowire.BytesType), []byte{0x02, 0x10, 0x80})},
		{"exit as a varint", key(tag(fKeyExits, protowire.VarintType), []byte{0x01})},
		{"uint32 beyond 32 bits", cat(tag(fPartKeysTotal, protowire.VarintType), protowire.AppendVarint(nil, 1<<32|1))},
		{"parts beyond 32 bits", cat(tag(fPartParts, protowire.VarintType), protowire.AppendVarint(nil, 1<<32))},
		{"report id as a varint", cat(tag(fPartReportID, protowire.VarintType), []byte{0x07})},
		{"truncated tag", []byte{0x80}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sameDecode(t, appendEnvelope(nil, cat(body, tc.tail)), Limits{})
		})
	}
}

// FuzzDecodeDifferential compares DecodePart with the generated decoder on
// arbitrary part bodies (in a valid envelope), with the default Limits and
// with tight ones: the same accept or reject, the same reason, the same
// Part. Each body is tried in an envelope of every version. Seeds are in
// testdata/fuzz/FuzzDecodeDifferential.
func FuzzDecodeDifferential(f *testing.F) {
	f.Add([]byte{})
	tight := Limits{MaxParts: 2, MaxKeys: 8, MaxNameBytes: 3, MaxKeyBytes: 12, MaxExits: 1}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, v := range []Version{V1, V2, V3} {
			msg := appendEnvelopeVersion(nil, body, v)
			sameDecode(t, msg, Limits{})
			sameDecode(t, msg, tight)
		}
	})
}
