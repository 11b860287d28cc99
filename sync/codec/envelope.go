package codec

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
)

// wireVersion is the Envelope.version of a snapshot, and of a Part written
// as V1.
const wireVersion = 1

// Version is the Envelope.version of a Part: how its keys are written.
// Every version is read; a sender writes the newest its peers read
// (Assembler.WriteVersion).
type Version uint32

const (
	// V1 writes each key as a Key message (Part.keys).
	V1 Version = 1
	// V2 writes the keys as columns (Part fields 22 to 27, columns.go):
	// names front-coded, counters relative to what the previous key or
	// the key's own rows predict, zeros left out.
	V2 Version = 2
	// V3 is V2 with names that differ from the previous key's in a
	// trailing number written as the number's step, the share of a key
	// without a generation relative to the initial share, and rows
	// written by their entries that are not zero (columns.go).
	V3 Version = 3
	// Latest is the newest version: what EncodeReport writes, and what
	// every Part advertises that its sender reads (Part.Reads).
	Latest = V3
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// envelopeOverhead bounds the bytes an Envelope adds around its body: three
// tags, a version varint, a fixed32 and a length varint.
const envelopeOverhead = 3 + 5 + 4 + 10

// envelopeSize is the size of the Envelope that beginEnvelope starts for a
// body of size bytes: three tags, the one-byte version, the checksum, and
// the body with its length.
func envelopeSize(size int) int {
	return 3 + 1 + 4 + protowire.SizeBytes(size)
}

// beginEnvelope starts an Envelope whose body will be size bytes, with a
// zero checksum for endEnvelope to fill in, and returns where the body
// starts in msg, which must be empty.
func beginEnvelope(msg []byte, size int) ([]byte, int) {
	return beginEnvelopeVersion(msg, size, wireVersion)
}

// beginEnvelopeVersion is beginEnvelope with the version v (one byte).
func beginEnvelopeVersion(msg []byte, size int, v Version) ([]byte, int) {
	msg = protowire.AppendTag(msg, 1, protowire.VarintType)
	msg = protowire.AppendVarint(msg, uint64(v))
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
	return appendEnvelopeVersion(dst, body, wireVersion)
}

// appendEnvelopeVersion is appendEnvelope with version v.
func appendEnvelopeVersion(dst, body []byte, v Version) []byte {
	dst = protowire.AppendTag(dst, 1, protowire.VarintType)
	dst = protowire.AppendVarint(dst, uint64(v))
	dst = protowire.AppendTag(dst, 2, protowire.Fixed32Type)
	dst = protowire.AppendFixed32(dst, crc32.Checksum(body, castagnoli))
	dst = protowire.AppendTag(dst, 3, protowire.BytesType)
	return protowire.AppendBytes(dst, body)
}

// openEnvelope checks an Envelope and returns its body, which aliases msg.
// It is parsed by hand so that a truncated message is told from a corrupt
// one, and so that the checksum is verified before anything else is read.
func openEnvelope(msg []byte) ([]byte, error) {
	body, v, err := openEnvelopeVersion(msg)
	if err == nil && v != wireVersion {
		return nil, drop(ReasonVersion, "envelope version %d, want %d", v, wireVersion)
	}
	return body, err
}

// openEnvelopeVersion is openEnvelope for a Part: it accepts every Version
// and returns the one found.
func openEnvelopeVersion(msg []byte) ([]byte, Version, error) {
	var (
		version       uint64
		sum           uint32
		body          []byte
		hasSum, hasBd bool
	)
	for b := msg; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, 0, parseDrop(n)
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
			return nil, 0, parseDrop(n)
		}
		b = b[n:]
	}
	switch {
	case version < uint64(V1) || version > uint64(Latest):
		return nil, 0, drop(ReasonVersion, "envelope version %d, want %d to %d", version, V1, Latest)
	case !hasSum || !hasBd:
		return nil, 0, drop(ReasonCorrupt, "envelope without checksum or body")
	case crc32.Checksum(body, castagnoli) != sum:
		return nil, 0, drop(ReasonCorrupt, "checksum mismatch")
	}
	return body, Version(version), nil
}

func parseDrop(n int) error {
	err := protowire.ParseError(n)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return drop(ReasonTruncated, "%v", err)
	}
	return drop(ReasonCorrupt, "%v", err)
}
