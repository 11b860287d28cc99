package codec

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/region"
)

// ErrTooLarge is returned by EncodeReport and Size when one key's entry
// alone does not fit in a message of the size asked for.
var ErrTooLarge = errors.New("codec: entry larger than a message")

// EncodeReport encodes r as one or more messages of at most maxBytes bytes
// each (the connection's max_payload), all carrying report id id, in the
// version up to Latest that makes them smallest (Smallest). Keys are split
// between parts in order; every part repeats the header. A report without
// keys is one message. A sender whose peers may not all read Latest uses
// EncodeReportUpTo.
func EncodeReport(r *region.Report, id uint64, maxBytes int) ([][]byte, error) {
	return EncodeReportUpTo(r, id, maxBytes, Latest)
}

// EncodeReportUpTo is EncodeReport in the smallest version up to v.
func EncodeReportUpTo(r *region.Report, id uint64, maxBytes int, v Version) ([][]byte, error) {
	var bufs [2][16]span
	v, spans, err := smallest(r, id, maxBytes, v, &bufs)
	if err != nil {
		return nil, err
	}
	if v == V1 { // its encoding needs the keys' sizes: split again
		return EncodeReportVersion(r, id, maxBytes, V1)
	}
	return encodeSpans(r, id, v, spans, nil)
}

// Smallest is the version up to v whose messages for r are fewest bytes
// (the newest on a tie): the columns (V2, V3) save most of a listing, but
// their framing costs a report of a key or two a few bytes more than V1's
// messages, and V3's flags cost a byte more than V2's for a key whose base
// differs from the previous key's or that has exit records.
func Smallest(r *region.Report, id uint64, maxBytes int, v Version) (Version, error) {
	var bufs [2][16]span
	v, _, err := smallest(r, id, maxBytes, v, &bufs)
	return v, err
}

// smallest is Smallest, with the split of the version it picks when that
// is V2 or later (EncodeReportUpTo encodes it rather than splitting again),
// in bufs unless it has more than 16 parts. The report's strings are
// checked once, not once a version.
func smallest(r *region.Report, id uint64, maxBytes int, v Version, bufs *[2][16]span) (Version, []span, error) {
	if v < V2 {
		return V1, nil, nil
	}
	v = min(v, Latest)
	if err := checkUTF8(r); err != nil {
		return 0, nil, err
	}
	best, err := splitChecked(r, id, maxBytes, v, nil, bufs[0][:0])
	if err != nil {
		return 0, nil, err
	}
	bv, bytes, free := v, spansSize(r, id, best), 1
	for older := v - 1; older >= V1; older-- {
		if spans, err := splitChecked(r, id, maxBytes, older, nil, bufs[free][:0]); err == nil {
			if b := spansSize(r, id, spans); b < bytes {
				bv, bytes, best, free = older, b, spans, 1-free
			}
		}
	}
	if bv == V1 {
		best = nil
	}
	return bv, best, nil
}

// EncodeReportVersion is EncodeReport in version v (V1, V2 or V3).
//
// The messages are appended with protowire, byte for byte what proto.Marshal
// of a syncv1.Part makes (the tests check it): building a syncv1.Key per key
// first cost as much as the rest of the epoch's encoding.
func EncodeReportVersion(r *region.Report, id uint64, maxBytes int, v Version) ([][]byte, error) {
	if v < V1 || v > Latest {
		return nil, fmt.Errorf("codec: no wire version %d", v)
	}
	var sizes []int // of each Key message (V1)
	if v == V1 {
		sizes = make([]int, len(r.Keys))
	}
	var buf [16]span
	spans, err := split(r, id, maxBytes, v, sizes, buf[:0])
	if err != nil {
		return nil, err
	}
	return encodeSpans(r, id, v, spans, sizes)
}

// encodeSpans encodes the messages of r as split cut it in version v.
func encodeSpans(r *region.Report, id uint64, v Version, spans []span, sizes []int) ([][]byte, error) {
	out := make([][]byte, 0, len(spans))
	for p := range spans {
		msg, err := encodePart(r, id, v, spans, p, sizes)
		if err != nil {
			return nil, err
		}
		out = append(out, msg)
	}
	return out, nil
}

// Size returns the total length and the number of the messages that
// EncodeReport(r, id, maxBytes) returns, or its error, without encoding
// them: what a report costs on NATS. It splits r with EncodeReport's code,
// and allocates nothing for a report of up to 16 parts.
func Size(r *region.Report, id uint64, maxBytes int) (bytes, msgs int, err error) {
	var bufs [2][16]span
	v, spans, err := smallest(r, id, maxBytes, Latest, &bufs)
	if err != nil {
		return 0, 0, err
	}
	if v == V1 {
		return SizeVersion(r, id, maxBytes, V1)
	}
	return spansSize(r, id, spans), len(spans), nil
}

// SizeVersion is Size for EncodeReportVersion(r, id, maxBytes, v).
func SizeVersion(r *region.Report, id uint64, maxBytes int, v Version) (bytes, msgs int, err error) {
	if v < V1 || v > Latest {
		return 0, 0, fmt.Errorf("codec: no wire version %d", v)
	}
	var buf [16]span
	spans, err := split(r, id, maxBytes, v, nil, buf[:0])
	if err != nil {
		return 0, 0, err
	}
	return spansSize(r, id, spans), len(spans), nil
}

// spansSize is the total length of the messages of a split.
func spansSize(r *region.Report, id uint64, spans []span) int {
	bytes := 0
	for p := range spans {
		bytes += envelopeSize(bodySize(r, id, spans, p))
	}
	return bytes
}

// span is one part of a report as split cuts it: the keys from the end of
// the span before it up to end, whose fields in the Part take keyBytes
// (in V2 and V3, the columns cols).
type span struct {
	end      int
	keyBytes int
	cols     columns
}

// split divides r's keys in order between parts of at most maxBytes bytes
// each, every part repeating the header: the one rule of EncodeReport and
// Size. It appends the parts to spans, and stores each Key message's size
// in sizes (V1) unless sizes is nil.
func split(r *region.Report, id uint64, maxBytes int, v Version, sizes []int, spans []span) ([]span, error) {
	if err := checkUTF8(r); err != nil {
		return nil, err
	}
	return splitChecked(r, id, maxBytes, v, sizes, spans)
}

// splitChecked is split of a report whose strings checkUTF8 passed.
func splitChecked(r *region.Report, id uint64, maxBytes int, v Version, sizes []int, spans []span) ([]span, error) {
	// The header sized with the largest varints for part, parts and keys.
	budget := maxBytes - envelopeOverhead - headerSize(r, id, ^uint32(0), ^uint32(0), ^uint32(0))
	if budget <= 0 {
		return nil, fmt.Errorf("%w: a %d-byte message cannot hold the report header", ErrTooLarge, maxBytes)
	}
	if uint64(len(r.Keys)) > uint64(^uint32(0)) {
		return nil, fmt.Errorf("%w: %d keys", ErrTooLarge, len(r.Keys))
	}
	if v >= V2 {
		return splitColumns(r, budget, spans, v)
	}
	n := 0 // bytes of the current part's keys
	for i := range r.Keys {
		size := keySize(&r.Keys[i])
		if sizes != nil {
			sizes[i] = size
		}
		k := 1 + protowire.SizeBytes(size) // tag and length in Part
		if k > budget {
			return nil, tooLarge(&r.Keys[i], k, budget)
		}
		if n+k > budget {
			spans = append(spans, span{end: i, keyBytes: n})
			n = 0
		}
		n += k
	}
	return append(spans, span{end: len(r.Keys), keyBytes: n}), nil
}

func tooLarge(k *region.KeyReport, need, budget int) error {
	return fmt.Errorf("%w: key %q needs %d bytes, %d available", ErrTooLarge, k.Key, need, budget)
}

// splitColumns is split for V2 and V3: a key written after another costs
// less than the first of a part, so a key that does not fit is sized again
// as the first of the next part.
func splitColumns(r *region.Report, budget int, spans []span, v Version) ([]span, error) {
	sh := shapeOf(r, v)
	var part columns
	var prev *region.KeyReport
	for i := range r.Keys {
		k := &r.Keys[i]
		c, _ := keyColumns(k, prev, sh)
		next := part
		next.add(&c)
		if next.size() > budget {
			if prev == nil {
				return nil, tooLarge(k, next.size(), budget)
			}
			spans = append(spans, span{end: i, keyBytes: part.size(), cols: part})
			next, _ = keyColumns(k, nil, sh)
			if next.size() > budget {
				return nil, tooLarge(k, next.size(), budget)
			}
		}
		part, prev = next, k
	}
	return append(spans, span{end: len(r.Keys), keyBytes: part.size(), cols: part}), nil
}

// bodySize is the size of the Part body of spans[p].
func bodySize(r *region.Report, id uint64, spans []span, p int) int {
	return headerSize(r, id, uint32(p), uint32(len(spans)), uint32(len(r.Keys))) + spans[p].keyBytes
}

// encodePart encodes the message of spans[p]; sizes are the keys' sizes
// (V1).
func encodePart(r *region.Report, id uint64, v Version, spans []span, p int, sizes []int) ([]byte, error) {
	start := 0
	if p > 0 {
		start = spans[p-1].end
	}
	size := bodySize(r, id, spans, p)
	msg, body := beginEnvelopeVersion(make([]byte, 0, envelopeSize(size)), size, v)
	msg = appendHeader(msg, r, id, uint32(p), uint32(len(spans)), uint32(len(r.Keys)))
	if v == V1 {
		for i := start; i < spans[p].end; i++ {
			msg = appendKey(msg, &r.Keys[i], sizes[i])
		}
	}
	msg = appendTrailer(msg, r)
	if v >= V2 {
		var w colWriter
		msg, w = beginColumns(msg, &spans[p].cols)
		var prev *region.KeyReport
		sh := shapeOf(r, v)
		for i := start; i < spans[p].end; i++ {
			c := encodeKey(&r.Keys[i], prev, sh)
			w.key(&r.Keys[i], &c, sh)
			prev = &r.Keys[i]
		}
		if !w.done() {
			return nil, fmt.Errorf("codec: encoding part %d: columns not as sized", p) // a bug
		}
	}
	if len(msg)-body != size {
		return nil, fmt.Errorf("codec: encoding part %d: %d bytes, sized %d", p, len(msg)-body, size) // a bug
	}
	return endEnvelope(msg, body), nil
}

// checkUTF8 rejects what proto.Marshal rejects: a string that is not UTF-8
// (a receiver would drop the whole part as corrupt).
func checkUTF8(r *region.Report) error {
	bad := func(what, s string) error {
		return fmt.Errorf("codec: encoding the report: %s %q is not valid UTF-8", what, s)
	}
	switch {
	case !utf8.ValidString(r.Region):
		return bad("region", r.Region)
	case !utf8.ValidString(r.Replica):
		return bad("replica", r.Replica)
	case !utf8.ValidString(r.Policy):
		return bad("policy", r.Policy)
	}
	for i := range r.Rules {
		if !utf8.ValidString(r.Rules[i].Name) {
			return bad("rule", r.Rules[i].Name)
		}
	}
	for _, s := range r.Regions {
		if !utf8.ValidString(s) {
			return bad("region", s)
		}
	}
	for i := range r.Keys {
		if !utf8.ValidString(r.Keys[i].Key) {
			return bad("key", r.Keys[i].Key)
		}
	}
	return nil
}

// headerSize is the size of a Part's header fields.
func headerSize(r *region.Report, id uint64, part, parts, keys uint32) int {
	n := stringSize(r.Region) + stringSize(r.Replica) + varintSize(r.Epoch) + varintSize(uint64(unixNano(r.SentAt)))
	if r.Exchange {
		n += 2
	}
	for _, s := range r.Regions {
		n += 1 + protowire.SizeBytes(len(s)) // repeated: empty strings too
	}
	if id != 0 {
		n += 1 + 8
	}
	n += varintSize(uint64(r.Refresh)) + varintSize(uint64(r.RefreshFrom)) + varintSize(uint64(r.RefreshCount)) + varintSize(r.Since)
	n += varintSize2(r.Prev) + varintSize2(r.Resent)
	for _, s := range r.Resend {
		n += 2 + protowire.SizeBytes(len(s)) // field 18: a two-byte tag
	}
	n += rulesSize(r) + 2 + 1 // and reads, Latest
	return n + varintSize(uint64(part)) + varintSize(uint64(parts)) + varintSize(uint64(keys))
}

func appendHeader(b []byte, r *region.Report, id uint64, part, parts, keys uint32) []byte {
	b = appendString(b, fPartRegion, r.Region)
	b = appendString(b, fPartReplica, r.Replica)
	b = appendVarint(b, fPartEpoch, r.Epoch)
	b = appendVarint(b, fPartSentAt, uint64(unixNano(r.SentAt)))
	if r.Exchange {
		b = appendVarint(b, fPartExchange, 1)
	}
	for _, s := range r.Regions {
		b = protowire.AppendTag(b, fPartRegions, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	if id != 0 {
		b = protowire.AppendTag(b, fPartReportID, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, id)
	}
	b = appendVarint(b, fPartPart, uint64(part))
	b = appendVarint(b, fPartParts, uint64(parts))
	return appendVarint(b, fPartKeysTotal, uint64(keys))
}

// appendTrailer appends the header fields numbered after the keys, where
// proto.Marshal puts them.
func appendTrailer(b []byte, r *region.Report) []byte {
	b = appendVarint(b, fPartRefresh, uint64(r.Refresh))
	b = appendVarint(b, fPartRefFrom, uint64(r.RefreshFrom))
	b = appendVarint(b, fPartRefCount, uint64(r.RefreshCount))
	b = appendVarint(b, fPartSince, r.Since)
	b = appendVarint(b, fPartPrev, r.Prev)
	b = appendVarint(b, fPartResent, r.Resent)
	for _, s := range r.Resend {
		b = protowire.AppendTag(b, fPartResend, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	b = appendRules(b, r)
	b = protowire.AppendTag(b, fPartReads, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(Latest))
}

// keySize is the size of k's Key message. Every field number is below 16,
// so every tag is one byte.
func keySize(k *region.KeyReport) int {
	n := stringSize(k.Key) + varintSize(k.Generation) + varintSize(protowire.EncodeZigZag(k.Base)) +
		packedSize(k.Row) + packedSize(k.Taken) + packedSize(k.In) + packedSize(k.InTaken) +
		varintSize(uint64(k.SharePPM)) + varintSize(uint64(k.Demand)) + varintSize(uint64(k.Granted)) +
		packedSize(k.Settled) + packedSize(k.Tokens) + varintSize(uint64(k.TokensWindow))
	for i := range k.Exits {
		n += 1 + protowire.SizeBytes(exitSize(&k.Exits[i]))
	}
	return n
}

func appendKey(b []byte, k *region.KeyReport, size int) []byte {
	b = protowire.AppendTag(b, fPartKeys, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = appendString(b, fKeyKey, k.Key)
	b = appendVarint(b, fKeyGeneration, k.Generation)
	b = appendVarint(b, fKeyBase, protowire.EncodeZigZag(k.Base))
	b = appendPacked(b, fKeyRow, k.Row)
	b = appendPacked(b, fKeyTaken, k.Taken)
	b = appendPacked(b, fKeyIn, k.In)
	b = appendPacked(b, fKeyInTaken, k.InTaken)
	b = appendVarint(b, fKeySharePPM, uint64(k.SharePPM))
	b = appendVarint(b, fKeyDemand, uint64(k.Demand))
	b = appendVarint(b, fKeyGranted, uint64(k.Granted))
	for i := range k.Exits {
		x := &k.Exits[i]
		b = protowire.AppendTag(b, fKeyExits, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(exitSize(x)))
		b = appendVarint(b, fExitGeneration, x.Generation)
		b = appendPacked(b, fExitRow, x.Row)
		b = appendPacked(b, fExitTaken, x.Taken)
		b = appendPacked(b, fExitIn, x.In)
		b = appendPacked(b, fExitInTaken, x.InTaken)
	}
	b = appendPacked(b, fKeySettled, k.Settled)
	b = appendPacked(b, fKeyTokens, k.Tokens)
	return appendVarint(b, fKeyTokensWin, uint64(k.TokensWindow))
}

func exitSize(x *region.Exit) int {
	return varintSize(x.Generation) + packedSize(x.Row) + packedSize(x.Taken) + packedSize(x.In) + packedSize(x.InTaken)
}
