package codec

import (
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// The proto3 primitives the hand-written encoders and decoders share.

// Field numbers of sync/v1's Part, Key and Exit (sync.proto).
const (
	fPartRegion    = 1
	fPartReplica   = 2
	fPartEpoch     = 3
	fPartSentAt    = 4
	fPartExchange  = 5
	fPartRegions   = 6
	fPartReportID  = 7
	fPartPart      = 8
	fPartParts     = 9
	fPartKeysTotal = 10
	fPartKeys      = 11
	fPartRefresh   = 12
	fPartRefFrom   = 13
	fPartRefCount  = 14
	fPartSince     = 15
	fPartPrev      = 16
	fPartResent    = 17
	fPartResend    = 18
	fPartPolicy    = 19
	fPartRules     = 20
	fPartReads     = 21

	// The key columns of a version 2 Part (columns.go).
	fColNameLens = 22
	fColNames    = 23
	fColFlags    = 24
	fColScalars  = 25
	fColValues   = 26
	fColLengths  = 27

	fKeyKey        = 1
	fKeyGeneration = 2
	fKeyBase       = 3
	fKeyRow        = 4
	fKeyTaken      = 5
	fKeyIn         = 6
	fKeyInTaken    = 7
	fKeySharePPM   = 8
	fKeyDemand     = 9
	fKeyGranted    = 10
	fKeyExits      = 11
	fKeySettled    = 12
	fKeyTokens     = 13
	fKeyTokensWin  = 14

	fExitGeneration = 1
	fExitRow        = 2
	fExitTaken      = 3
	fExitIn         = 4
	fExitInTaken    = 5
)

// The sizes and appenders of proto3 fields with one-byte tags: a zero
// scalar, an empty string and an empty repeated field are left out.

// varintSize2 is varintSize for a field numbered 16 or more: a two-byte tag.
func varintSize2(v uint64) int {
	if v == 0 {
		return 0
	}
	return 2 + protowire.SizeVarint(v)
}

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

// errWire is returned (as a negative length) for anything proto.Unmarshal
// would reject: a bad tag, varint, length, group or UTF-8 string.
const errWire = -1

// consumeTag is protowire.ConsumeTag with the field number range that
// proto.Unmarshal enforces (ConsumeTag accepts up to MaxInt32).
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	if len(b) > 0 && b[0] < 0x80 && b[0] >= 1<<3 { // every tag of ours
		return protowire.Number(b[0] >> 3), protowire.Type(b[0] & 7), 1
	}
	v, n := protowire.ConsumeVarint(b)
	if n < 0 || v>>3 < uint64(protowire.MinValidNumber) || v>>3 > uint64(protowire.MaxValidNumber) {
		return 0, 0, errWire
	}
	return protowire.Number(v >> 3), protowire.Type(v & 7), n
}

// consumeString consumes a proto3 string field, which must be UTF-8.
func consumeString(b []byte) ([]byte, int) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 || !utf8.Valid(v) {
		return nil, errWire
	}
	return v, n
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
