package exchange

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ration-dev/ration/region"
	syncv1 "github.com/ration-dev/ration/sync/v1"
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
func EncodeReport(r *region.Report, id uint64, maxBytes int) ([][]byte, error) {
	hdr := &syncv1.Part{
		Region:         r.Region,
		Replica:        r.Replica,
		Epoch:          r.Epoch,
		SentAtUnixNano: unixNano(r.SentAt),
		Exchange:       r.Exchange,
		Regions:        r.Regions,
		ReportId:       id,
		Part:           ^uint32(0), // the largest varints, for sizing
		Parts:          ^uint32(0),
		KeysTotal:      ^uint32(0),
	}
	budget := maxBytes - envelopeOverhead - proto.Size(hdr)
	if budget <= 0 {
		return nil, fmt.Errorf("%w: a %d-byte message cannot hold the report header", ErrTooLarge, maxBytes)
	}
	if uint64(len(r.Keys)) > uint64(^uint32(0)) {
		return nil, fmt.Errorf("%w: %d keys", ErrTooLarge, len(r.Keys))
	}
	keys := make([]syncv1.Key, len(r.Keys))
	ptrs := make([]*syncv1.Key, len(r.Keys))
	var cuts []int // index of the first key of each part after the first
	used := 0
	for i := range r.Keys {
		k := &r.Keys[i]
		keys[i] = syncv1.Key{
			Key:        k.Key,
			Generation: k.Generation,
			Base:       k.Base,
			Row:        k.Row,
			Taken:      k.Taken,
			In:         k.In,
			InTaken:    k.InTaken,
			SharePpm:   k.SharePPM,
			Demand:     k.Demand,
			Granted:    k.Granted,
			Settled:    k.Settled,
		}
		for _, x := range k.Exits {
			keys[i].Exits = append(keys[i].Exits, &syncv1.Exit{
				Generation: x.Generation, Row: x.Row, Taken: x.Taken, In: x.In, InTaken: x.InTaken,
			})
		}
		ptrs[i] = &keys[i]
		n := proto.Size(&keys[i])
		n += 1 + protowire.SizeVarint(uint64(n)) // tag and length in Part
		if n > budget {
			return nil, fmt.Errorf("%w: key %q needs %d bytes, %d available", ErrTooLarge, k.Key, n, budget)
		}
		if used+n > budget {
			cuts = append(cuts, i)
			used = 0
		}
		used += n
	}
	parts := len(cuts) + 1
	hdr.Parts, hdr.KeysTotal = uint32(parts), uint32(len(r.Keys))
	out := make([][]byte, 0, parts)
	start := 0
	for p := 0; p < parts; p++ {
		end := len(r.Keys)
		if p < len(cuts) {
			end = cuts[p]
		}
		hdr.Part, hdr.Keys = uint32(p), ptrs[start:end]
		body, err := proto.Marshal(hdr)
		if err != nil {
			return nil, fmt.Errorf("exchange: encoding part %d: %w", p, err)
		}
		out = append(out, appendEnvelope(make([]byte, 0, len(body)+envelopeOverhead), body))
		start = end
	}
	return out, nil
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
// result do not alias msg.
func DecodePart(msg []byte, lim Limits) (*Part, error) {
	lim = lim.withDefaults()
	if len(msg) > lim.MaxMessageBytes {
		return nil, drop(ReasonOversized, "%d bytes, more than %d", len(msg), lim.MaxMessageBytes)
	}
	body, err := openEnvelope(msg)
	if err != nil {
		return nil, err
	}
	var pb syncv1.Part
	if err := proto.Unmarshal(body, &pb); err != nil {
		return nil, drop(ReasonCorrupt, "part: %v", err)
	}
	bad := func(format string, args ...any) error { return drop(ReasonInconsistent, format, args...) }
	switch {
	case pb.Region == "" || len(pb.Region) > lim.MaxNameBytes:
		return nil, bad("region name of %d bytes", len(pb.Region))
	case pb.Replica == "" || len(pb.Replica) > lim.MaxNameBytes:
		return nil, bad("replica name of %d bytes", len(pb.Replica))
	case pb.Parts == 0 || pb.Part >= pb.Parts:
		return nil, bad("part %d of %d", pb.Part, pb.Parts)
	case int64(pb.Parts) > int64(lim.MaxParts):
		return nil, drop(ReasonOversized, "%d parts, more than %d", pb.Parts, lim.MaxParts)
	case int64(pb.KeysTotal) > int64(lim.MaxKeys):
		return nil, drop(ReasonOversized, "%d keys, more than %d", pb.KeysTotal, lim.MaxKeys)
	case len(pb.Keys) > int(pb.KeysTotal):
		return nil, bad("part holds %d keys of a report of %d", len(pb.Keys), pb.KeysTotal)
	case len(pb.Regions) > maxRegions:
		return nil, bad("%d regions, more than %d", len(pb.Regions), maxRegions)
	}
	for _, r := range pb.Regions {
		if len(r) > lim.MaxNameBytes {
			return nil, bad("region name of %d bytes", len(r))
		}
	}
	p := &Part{
		Header: region.Report{
			Region:   pb.Region,
			Replica:  pb.Replica,
			Epoch:    pb.Epoch,
			SentAt:   fromUnixNano(pb.SentAtUnixNano),
			Exchange: pb.Exchange,
			Regions:  pb.Regions,
		},
		ID:        pb.ReportId,
		Index:     int(pb.Part),
		Count:     int(pb.Parts),
		KeysTotal: int(pb.KeysTotal),
		Size:      len(msg),
	}
	if len(pb.Keys) > 0 {
		p.Keys = make([]region.KeyReport, len(pb.Keys))
	}
	for i, k := range pb.Keys {
		if len(k.Key) > lim.MaxKeyBytes {
			return nil, bad("key %d: %d bytes, more than %d", i, len(k.Key), lim.MaxKeyBytes)
		}
		if len(k.Exits) > lim.MaxExits {
			return nil, bad("key %q: %d exit records, more than %d", k.Key, len(k.Exits), lim.MaxExits)
		}
		kr := region.KeyReport{
			Key:        k.Key,
			Generation: k.Generation,
			Base:       k.Base,
			Row:        k.Row,
			Taken:      k.Taken,
			In:         k.In,
			InTaken:    k.InTaken,
			SharePPM:   k.SharePpm,
			Demand:     k.Demand,
			Granted:    k.Granted,
			Settled:    k.Settled,
		}
		if len(k.Exits) > 0 {
			kr.Exits = make([]region.Exit, len(k.Exits))
			for j, x := range k.Exits {
				if x == nil {
					continue
				}
				kr.Exits[j] = region.Exit{Generation: x.Generation, Row: x.Row, Taken: x.Taken, In: x.In, InTaken: x.InTaken}
			}
		}
		p.Keys[i] = kr
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
