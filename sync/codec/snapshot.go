package codec

import (
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ration-dev/ration/region"
	syncv1 "github.com/ration-dev/ration/sync/v1"
)

// EncodeSnapshot encodes a region's exchange state for its store, in the
// same checksummed envelope as the reports. The holder writes it every
// epoch, so it is appended with protowire like the reports: byte for byte
// what proto.Marshal of a syncv1.Snapshot makes (the tests check it).
func EncodeSnapshot(s *region.Snapshot) ([]byte, error) {
	if s.Partial || len(s.Removed) > 0 {
		return nil, fmt.Errorf("codec: encoding snapshot: a partial snapshot is a store's to apply (EncodeSnapshotParts)")
	}
	if err := checkSnapshotUTF8(s); err != nil {
		return nil, err
	}
	sizes := make([]int, len(s.Keys)) // of each KeySnapshot message
	size := stringSize(s.Region) + varintSize(s.Epoch) + varintSize(s.GenerationFloor) + packedSize(s.Heard)
	for _, r := range s.Regions {
		size += 1 + protowire.SizeBytes(len(r))
	}
	var heardAt int
	for _, t := range s.HeardAt {
		heardAt += protowire.SizeVarint(uint64(unixNano(t)))
	}
	if len(s.HeardAt) > 0 {
		size += 1 + protowire.SizeBytes(heardAt)
	}
	for i := range s.Keys {
		sizes[i] = keySnapshotSize(&s.Keys[i])
		size += 1 + protowire.SizeBytes(sizes[i])
	}

	msg, body := beginEnvelope(make([]byte, 0, 3+1+4+protowire.SizeBytes(size)), size)
	msg = appendString(msg, 1, s.Region)
	for _, r := range s.Regions {
		msg = protowire.AppendString(protowire.AppendTag(msg, 2, protowire.BytesType), r)
	}
	msg = appendVarint(msg, 3, s.Epoch)
	msg = appendVarint(msg, 4, s.GenerationFloor)
	msg = appendPacked(msg, 5, s.Heard)
	if len(s.HeardAt) > 0 {
		msg = protowire.AppendVarint(protowire.AppendTag(msg, 6, protowire.BytesType), uint64(heardAt))
		for _, t := range s.HeardAt {
			msg = protowire.AppendVarint(msg, uint64(unixNano(t)))
		}
	}
	for i := range s.Keys {
		msg = appendKeySnapshot(protowire.AppendTag(msg, 7, protowire.BytesType), &s.Keys[i], sizes[i])
	}
	if len(msg)-body != size {
		return nil, fmt.Errorf("codec: encoding snapshot: %d bytes, sized %d", len(msg)-body, size) // a bug
	}
	return endEnvelope(msg, body), nil
}

func checkSnapshotUTF8(s *region.Snapshot) error {
	bad := func(what, v string) error {
		return fmt.Errorf("codec: encoding snapshot: %s %q is not valid UTF-8", what, v)
	}
	if !utf8.ValidString(s.Region) {
		return bad("region", s.Region)
	}
	for _, r := range s.Regions {
		if !utf8.ValidString(r) {
			return bad("region", r)
		}
	}
	for i := range s.Keys {
		if !utf8.ValidString(s.Keys[i].Key) {
			return bad("key", s.Keys[i].Key)
		}
	}
	return nil
}

// keySnapshotSize is the size of k's KeySnapshot message; all its tags are
// one byte.
func keySnapshotSize(k *region.KeySnapshot) int {
	n := stringSize(k.Key) + varintSize(k.Generation) + varintSize(k.GenerationFloor) + varintSize(protowire.EncodeZigZag(k.Base)) +
		packedSize(k.Row) + packedSize(k.Taken) + packedSize(k.In) + packedSize(k.InTaken) +
		packedSize(k.Refund) + packedSize(k.Unclaim) + doublesSize(k.Demand) +
		packedSize(k.Ack) + packedSize(k.AckTaken) + packedSize(k.Settled) +
		wideTag(packedSize(k.Tokens)) + wideTag(packedSize(k.TokensIn)) +
		wideTag(varintSize(uint64(k.TokensWindow))) + wideTag(packedSize(k.TokensInWindow))
	for i := range k.Exits {
		n += 1 + protowire.SizeBytes(exitSnapshotSize(&k.Exits[i]))
	}
	return n
}

func appendKeySnapshot(b []byte, k *region.KeySnapshot, size int) []byte {
	b = protowire.AppendVarint(b, uint64(size))
	b = appendString(b, 1, k.Key)
	b = appendVarint(b, 2, k.Generation)
	b = appendVarint(b, 3, k.GenerationFloor)
	b = appendVarint(b, 4, protowire.EncodeZigZag(k.Base))
	b = appendPacked(b, 5, k.Row)
	b = appendPacked(b, 6, k.Taken)
	b = appendPacked(b, 7, k.In)
	b = appendPacked(b, 8, k.InTaken)
	b = appendPacked(b, 9, k.Refund)
	b = appendPacked(b, 10, k.Unclaim)
	if len(k.Demand) > 0 {
		b = protowire.AppendVarint(protowire.AppendTag(b, 11, protowire.BytesType), uint64(8*len(k.Demand)))
		for _, d := range k.Demand {
			b = protowire.AppendFixed64(b, math.Float64bits(d))
		}
	}
	for i := range k.Exits {
		x := &k.Exits[i]
		b = protowire.AppendTag(b, 12, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(exitSnapshotSize(x)))
		// The exit field is always set, so it is written even when empty.
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(exitSize(&x.Exit)))
		b = appendVarint(b, fExitGeneration, x.Generation)
		b = appendPacked(b, fExitRow, x.Row)
		b = appendPacked(b, fExitTaken, x.Taken)
		b = appendPacked(b, fExitIn, x.In)
		b = appendPacked(b, fExitInTaken, x.InTaken)
		b = appendPacked(b, 2, x.Refund)
		b = appendPacked(b, 3, x.Ack)
		b = appendVarint(b, 4, uint64(unixNano(x.At)))
		b = appendPacked(b, 5, x.Dropped)
	}
	b = appendPacked(b, 13, k.Ack)
	b = appendPacked(b, 14, k.AckTaken)
	b = appendPacked(b, 15, k.Settled)
	b = appendPacked(b, 16, k.Tokens)
	b = appendPacked(b, 17, k.TokensIn)
	b = appendVarint(b, 18, uint64(k.TokensWindow))
	return appendPacked(b, 19, k.TokensInWindow)
}

// wideTag adds to the size of a field numbered 16 to 2047 (0 when the field
// is left out) the second byte of its tag.
func wideTag(size int) int {
	if size == 0 {
		return 0
	}
	return size + 1
}

func exitSnapshotSize(x *region.ExitSnapshot) int {
	return 1 + protowire.SizeBytes(exitSize(&x.Exit)) + packedSize(x.Refund) + packedSize(x.Ack) +
		varintSize(uint64(unixNano(x.At))) + packedSize(x.Dropped)
}

func doublesSize(v []float64) int {
	if len(v) == 0 {
		return 0
	}
	return 1 + protowire.SizeBytes(8*len(v))
}

// EncodeSnapshotParts encodes s for a store that keeps a snapshot's keys
// apart, so that a partial snapshot (region.Snapshot.Partial) replaces the
// records of its keys only: a head, which is EncodeSnapshot of s without
// its keys, and a record for each key, its compact record
// (snapshot_record.go), which the store keeps under the key's name and
// which leaves the name out. Every row of a key must have a column for each
// of s.Regions, or none. JoinSnapshot puts them together. Partial and
// Removed are the store's to apply, and are not encoded.
func EncodeSnapshotParts(s *region.Snapshot) (head []byte, records [][]byte, err error) {
	h := *s
	h.Keys, h.Partial, h.Removed = nil, false, nil
	if head, err = EncodeSnapshot(&h); err != nil {
		return nil, nil, err
	}
	m := len(s.Regions)
	var buf []byte // a few allocations of 64 KiB, carved into records
	records = make([][]byte, len(s.Keys))
	for i := range s.Keys {
		if !utf8.ValidString(s.Keys[i].Key) {
			return nil, nil, fmt.Errorf("codec: encoding snapshot: key %q is not valid UTF-8", s.Keys[i].Key)
		}
		if cap(buf)-len(buf) < 256 {
			buf = make([]byte, 0, 64<<10)
		}
		start := len(buf)
		if buf, err = appendRecord(buf, &s.Keys[i], m); err != nil {
			return nil, nil, err
		}
		records[i] = buf[start:len(buf):len(buf)]
	}
	return head, records, nil
}

// JoinSnapshot decodes a head and the records of its keys (records[i] is
// keys[i]'s), in any order, as EncodeSnapshotParts made them, or as the
// releases before it did (a record holding its key's name, which must be
// keys[i]); a whole snapshot of EncodeSnapshot is a head without records. A
// damaged head or record is a *DropError, and nothing is returned.
func JoinSnapshot(head []byte, keys []string, records [][]byte) (region.Snapshot, error) {
	body, err := openEnvelope(head)
	if err != nil {
		return region.Snapshot{}, err
	}
	if len(keys) != len(records) {
		return region.Snapshot{}, drop(ReasonCorrupt, "snapshot: %d records for %d keys", len(records), len(keys))
	}
	if len(records) == 0 {
		return decodeSnapshotBody(body)
	}
	// The legacy records are joined to the head's body and decoded with it.
	n := len(body)
	legacy := 0
	for i, r := range records {
		if len(r) > 0 && r[0] == recordLegacy {
			if err := checkRecord(r); err != nil {
				return region.Snapshot{}, fmt.Errorf("snapshot record %d: %w", i, err)
			}
			n += len(r)
			legacy++
		}
	}
	all := make([]byte, 0, n)
	all = append(all, body...)
	for _, r := range records {
		if len(r) > 0 && r[0] == recordLegacy {
			all = append(all, r...)
		}
	}
	snap, err := decodeSnapshotBody(all)
	if err != nil {
		return region.Snapshot{}, err
	}
	if legacy > 0 {
		// Decoded in order after the head's keys: each must be stored
		// under its own name.
		j := len(snap.Keys) - legacy
		for i, r := range records {
			if len(r) > 0 && r[0] == recordLegacy {
				if got := snap.Keys[j].Key; got != keys[i] {
					return region.Snapshot{}, drop(ReasonCorrupt, "snapshot record of key %q stored as %q", got, keys[i])
				}
				j++
			}
		}
	}
	m := len(snap.Regions)
	snap.Keys = slices.Grow(snap.Keys, len(records)-legacy)
	slab := recordSlab{keys: len(records) - legacy}
	for i, r := range records {
		switch {
		case len(r) == 0:
			return region.Snapshot{}, drop(ReasonTruncated, "snapshot record %d (key %q): empty", i, keys[i])
		case r[0] == recordLegacy:
			continue
		case r[0] != recordCompact:
			return region.Snapshot{}, drop(ReasonVersion, "snapshot record %d (key %q): format %#x", i, keys[i], r[0])
		case keys[i] == "":
			return region.Snapshot{}, drop(ReasonCorrupt, "snapshot record %d: no key", i)
		}
		snap.Keys = snap.Keys[:len(snap.Keys)+1]
		if err := decodeRecord(&snap.Keys[len(snap.Keys)-1], keys[i], r, m, &slab); err != nil {
			return region.Snapshot{}, fmt.Errorf("snapshot record %d (key %q): %w", i, keys[i], err)
		}
	}
	return snap, nil
}

// checkRecord checks that r is one key field of a Snapshot message.
func checkRecord(r []byte) error {
	num, typ, n := protowire.ConsumeTag(r)
	if n < 0 {
		return parseDrop(n)
	}
	if num != 7 || typ != protowire.BytesType {
		return drop(ReasonCorrupt, "field %d of type %d, want a key (7)", num, typ)
	}
	m := protowire.ConsumeFieldValue(num, typ, r[n:])
	if m < 0 {
		return parseDrop(m)
	}
	if n+m != len(r) {
		return drop(ReasonCorrupt, "%d bytes after the key", len(r)-n-m)
	}
	return nil
}

// DecodeSnapshot decodes what EncodeSnapshot wrote. A damaged blob is a
// *DropError; region.State.Restore validates the content.
func DecodeSnapshot(b []byte) (region.Snapshot, error) {
	body, err := openEnvelope(b)
	if err != nil {
		return region.Snapshot{}, err
	}
	return decodeSnapshotBody(body)
}

// decodeSnapshotBody decodes a Snapshot message.
func decodeSnapshotBody(body []byte) (region.Snapshot, error) {
	var pb syncv1.Snapshot
	if err := proto.Unmarshal(body, &pb); err != nil {
		return region.Snapshot{}, drop(ReasonCorrupt, "snapshot: %v", err)
	}
	s := region.Snapshot{
		Region:          pb.Region,
		Regions:         pb.Regions,
		Epoch:           pb.Epoch,
		GenerationFloor: pb.GenerationFloor,
		Heard:           pb.Heard,
		Keys:            make([]region.KeySnapshot, len(pb.Keys)),
	}
	s.HeardAt = make([]time.Time, len(pb.HeardAtUnixNano))
	for i, ns := range pb.HeardAtUnixNano {
		s.HeardAt[i] = fromUnixNano(ns)
	}
	for i, k := range pb.Keys {
		ks := region.KeySnapshot{
			Key: k.Key, Generation: k.Generation, GenerationFloor: k.GenerationFloor, Base: k.Base,
			Row: k.Row, Taken: k.Taken, In: k.In, InTaken: k.InTaken,
			Refund: k.Refund, Unclaim: k.Unclaim, Demand: k.Demand,
			Ack: k.Ack, AckTaken: k.AckTaken, Settled: k.Settled,
			Tokens: k.Tokens, TokensIn: k.TokensIn, TokensWindow: k.TokensWindow, TokensInWindow: k.TokensInWindow,
		}
		for _, x := range k.Exits {
			e := x.GetExit()
			ks.Exits = append(ks.Exits, region.ExitSnapshot{
				Exit:    region.Exit{Generation: e.GetGeneration(), Row: e.GetRow(), Taken: e.GetTaken(), In: e.GetIn(), InTaken: e.GetInTaken()},
				Refund:  x.Refund,
				Ack:     x.Ack,
				Dropped: x.Dropped,
				At:      fromUnixNano(x.AtUnixNano),
			})
		}
		s.Keys[i] = ks
	}
	return s, nil
}
