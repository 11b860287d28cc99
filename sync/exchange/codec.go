package exchange

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/region"
)

// wireVersion is the Envelope.version this package writes and reads.
const wireVersion = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Limits bound what the decoder accepts, so that a hostile or broken
// message costs bounded memory and CPU. The zero value of a field means its
// default.
type Limits struct {
	// MaxMessageBytes is the largest message accepted (default 64 MiB, the
	// largest max_payload a NATS server allows). Senders split reports to
	// the connection's max_payload, which is smaller.
	MaxMessageBytes int
	// MaxParts is the most parts one report may have (default 1024).
	MaxParts int
	// MaxKeys is the most keys one report may carry (default 4,194,304).
	MaxKeys int
	// MaxNameBytes bounds region and replica names (default 256).
	MaxNameBytes int
	// MaxKeyBytes bounds a key's identity (default 4096).
	MaxKeyBytes int
	// MaxExits bounds the exit records of one key (default 64).
	MaxExits int
}

func (l Limits) withDefaults() Limits {
	if l.MaxMessageBytes <= 0 {
		l.MaxMessageBytes = 64 << 20
	}
	if l.MaxParts <= 0 {
		l.MaxParts = 1024
	}
	if l.MaxKeys <= 0 {
		l.MaxKeys = 4 << 20
	}
	if l.MaxNameBytes <= 0 {
		l.MaxNameBytes = 256
	}
	if l.MaxKeyBytes <= 0 {
		l.MaxKeyBytes = 4096
	}
	if l.MaxExits <= 0 {
		l.MaxExits = 64
	}
	return l
}

// maxRegions is region's bound on a region set.
const maxRegions = 64

// ErrTooLarge is returned by EncodeReport when one key's entry alone does
// not fit in a message of the size asked for.
var ErrTooLarge = errors.New("exchange: entry larger than a message")

// envelopeOverhead bounds the bytes an Envelope adds around its body: three
// tags, a version varint, a fixed32 and a length varint.
const envelopeOverhead = 3 + 5 + 4 + 10

// EncodeReport encodes r as one or more messages of at most maxBytes bytes
// each (the connection's max_payload), all carrying report id id. Keys are
// split between parts in order; every part repeats the header. A report
// without keys is one message.
//
// The messages are appended with protowire, byte for byte what proto.Marshal
// of a syncv1.Part makes (the tests check it): building a syncv1.Key per key
// first cost as much as the rest of the epoch's encoding.
func EncodeReport(r *region.Report, id uint64, maxBytes int) ([][]byte, error) {
	if err := checkUTF8(r); err != nil {
		return nil, err
	}
	// The header sized with the largest varints for part, parts and keys.
	budget := maxBytes - envelopeOverhead - headerSize(r, id, ^uint32(0), ^uint32(0), ^uint32(0))
	if budget <= 0 {
		return nil, fmt.Errorf("%w: a %d-byte message cannot hold the report header", ErrTooLarge, maxBytes)
	}
	if uint64(len(r.Keys)) > uint64(^uint32(0)) {
		return nil, fmt.Errorf("%w: %d keys", ErrTooLarge, len(r.Keys))
	}
	sizes := make([]int, len(r.Keys)) // of each Key message
	var (
		cuts []int // index of the first key of each part after the first
		used []int // bytes of each part's keys
	)
	n := 0
	for i := range r.Keys {
		sizes[i] = keySize(&r.Keys[i])
		k := 1 + protowire.SizeBytes(sizes[i]) // tag and length in Part
		if k > budget {
			return nil, fmt.Errorf("%w: key %q needs %d bytes, %d available", ErrTooLarge, r.Keys[i].Key, k, budget)
		}
		if n+k > budget {
			cuts, used = append(cuts, i), append(used, n)
			n = 0
		}
		n += k
	}
	used = append(used, n)
	parts := len(cuts) + 1
	out := make([][]byte, 0, parts)
	start := 0
	for p := 0; p < parts; p++ {
		end := len(r.Keys)
		if p < len(cuts) {
			end = cuts[p]
		}
		size := headerSize(r, id, uint32(p), uint32(parts), uint32(len(r.Keys))) + used[p]
		msg := make([]byte, 0, 3+1+4+protowire.SizeBytes(size))
		msg, body := beginEnvelope(msg, size)
		msg = appendHeader(msg, r, id, uint32(p), uint32(parts), uint32(len(r.Keys)))
		for i := start; i < end; i++ {
			msg = appendKey(msg, &r.Keys[i], sizes[i])
		}
		if len(msg)-body != size {
			return nil, fmt.Errorf("exchange: encoding part %d: %d bytes, sized %d", p, len(msg)-body, size) // a bug
		}
		out = append(out, endEnvelope(msg, body))
		start = end
	}
	return out, nil
}

// checkUTF8 rejects what proto.Marshal rejects: a string that is not UTF-8
// (a receiver would drop the whole part as corrupt).
func checkUTF8(r *region.Report) error {
	bad := func(what, s string) error {
		return fmt.Errorf("exchange: encoding the report: %s %q is not valid UTF-8", what, s)
	}
	switch {
	case !utf8.ValidString(r.Region):
		return bad("region", r.Region)
	case !utf8.ValidString(r.Replica):
		return bad("replica", r.Replica)
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

// keySize is the size of k's Key message. Every field number is below 16,
// so every tag is one byte.
func keySize(k *region.KeyReport) int {
	n := stringSize(k.Key) + varintSize(k.Generation) + varintSize(protowire.EncodeZigZag(k.Base)) +
		packedSize(k.Row) + packedSize(k.Taken) + packedSize(k.In) + packedSize(k.InTaken) +
		varintSize(uint64(k.SharePPM)) + varintSize(uint64(k.Demand)) + varintSize(uint64(k.Granted)) +
		packedSize(k.Settled)
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
	return appendPacked(b, fKeySettled, k.Settled)
}

func exitSize(x *region.Exit) int {
	return varintSize(x.Generation) + packedSize(x.Row) + packedSize(x.Taken) + packedSize(x.In) + packedSize(x.InTaken)
}

// The sizes and appenders of proto3 fields with one-byte tags: a zero
// scalar, an empty string and an empty repeated field are left out.

func varintSize(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

func stringSize(s string) int {
	if s == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(s))
}

func packedSize[T int64 | uint64](v []T) int {
	if len(v) == 0 {
		return 0
	}
	return 1 + protowire.SizeBytes(valuesSize(v))
}

func valuesSize[T int64 | uint64](v []T) int {
	n := 0
	for _, x := range v {
		n += protowire.SizeVarint(uint64(x))
	}
	return n
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func appendPacked[T int64 | uint64](b []byte, num protowire.Number, v []T) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(valuesSize(v)))
	for _, x := range v {
		b = protowire.AppendVarint(b, uint64(x))
	}
	return b
}

// beginEnvelope starts an Envelope whose body will be size bytes, with a
// zero checksum for endEnvelope to fill in, and returns where the body
// starts in msg, which must be empty.
func beginEnvelope(msg []byte, size int) ([]byte, int) {
	msg = protowire.AppendTag(msg, 1, protowire.VarintType)
	msg = protowire.AppendVarint(msg, wireVersion)
	msg = protowire.AppendTag(msg, 2, protowire.Fixed32Type)
	msg = protowire.AppendFixed32(msg, 0)
	msg = protowire.AppendTag(msg, 3, protowire.BytesType)
	msg = protowire.AppendVarint(msg, uint64(size))
	return msg, len(msg)
}

// crcOffset is where beginEnvelope puts the checksum: after a tag, the
// one-byte version and another tag.
const crcOffset = 3

// endEnvelope fills in the checksum of the body that starts at body.
func endEnvelope(msg []byte, body int) []byte {
	binary.LittleEndian.PutUint32(msg[crcOffset:], crc32.Checksum(msg[body:], castagnoli))
	return msg
}

// appendEnvelope appends an Envelope holding body to dst.
func appendEnvelope(dst, body []byte) []byte {
	dst = protowire.AppendTag(dst, 1, protowire.VarintType)
	dst = protowire.AppendVarint(dst, wireVersion)
	dst = protowire.AppendTag(dst, 2, protowire.Fixed32Type)
	dst = protowire.AppendFixed32(dst, crc32.Checksum(body, castagnoli))
	dst = protowire.AppendTag(dst, 3, protowire.BytesType)
	return protowire.AppendBytes(dst, body)
}

// openEnvelope checks an Envelope and returns its body, which aliases msg.
// It is parsed by hand so that a truncated message is told from a corrupt
// one, and so that the checksum is verified before anything else is read.
func openEnvelope(msg []byte) ([]byte, error) {
	var (
		version       uint64
		sum           uint32
		body          []byte
		hasSum, hasBd bool
	)
	for b := msg; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, parseDrop(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			version, n = protowire.ConsumeVarint(b)
		case num == 2 && typ == protowire.Fixed32Type:
			sum, n = protowire.ConsumeFixed32(b)
			hasSum = true
		case num == 3 && typ == protowire.BytesType:
			body, n = protowire.ConsumeBytes(b)
			hasBd = true
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return nil, parseDrop(n)
		}
		b = b[n:]
	}
	switch {
	case version != wireVersion:
		return nil, drop(ReasonVersion, "envelope version %d, want %d", version, wireVersion)
	case !hasSum || !hasBd:
		return nil, drop(ReasonCorrupt, "envelope without checksum or body")
	case crc32.Checksum(body, castagnoli) != sum:
		return nil, drop(ReasonCorrupt, "checksum mismatch")
	}
	return body, nil
}

func parseDrop(n int) error {
	err := protowire.ParseError(n)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return drop(ReasonTruncated, "%v", err)
	}
	return drop(ReasonCorrupt, "%v", err)
}

// Part is one decoded message: a part of a replica's report.
type Part struct {
	// Header holds the report's header fields; Keys is nil.
	Header region.Report
	// ID, Index and Count are the report id and this part's place.
	ID           uint64
	Index, Count int
	// KeysTotal is the number of keys in the whole report.
	KeysTotal int
	// Keys are this part's keys.
	Keys []region.KeyReport
	// Size is the message's size in bytes.
	Size int
}

// DecodePart decodes one message, checking it against lim. It never
// panics; any problem is a *DropError naming the reason. The slices of the
// result do not alias msg. The slices of its keys are carved from a few
// shared allocations (decode.go), each with its capacity equal to its
// length, so that appending to one never writes into another.
func DecodePart(msg []byte, lim Limits) (*Part, error) {
	lim = lim.withDefaults()
	if len(msg) > lim.MaxMessageBytes {
		return nil, drop(ReasonOversized, "%d bytes, more than %d", len(msg), lim.MaxMessageBytes)
	}
	body, err := openEnvelope(msg)
	if err != nil {
		return nil, err
	}
	p := &Part{Size: len(msg)}
	if err := decodeBody(body, lim, p); err != nil {
		return nil, err
	}
	return p, nil
}

// unixNano is t in Unix nanoseconds, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// fromUnixNano is the inverse of unixNano.
func fromUnixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
