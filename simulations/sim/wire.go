package sim

import (
	"google.golang.org/protobuf/proto"

	"github.com/ration-dev/ration/region"
	syncv1 "github.com/ration-dev/ration/sync/v1"
)

// maxPayload is NATS's default max_payload, to which reports are split.
const maxPayload = 1 << 20

// envelopeOverhead bounds the bytes the sync envelope adds around a part
// (version, checksum and length).
const envelopeOverhead = 22

// reportWire returns the bytes and messages a report takes on NATS in the
// sync/v1 wire format: the report's keys split into parts of at most
// maxPayload bytes, each repeating the header.
func reportWire(r *region.Report) (bytes, msgs int) {
	hdr := &syncv1.Part{
		Region: r.Region, Replica: r.Replica, Epoch: r.Epoch, SentAtUnixNano: r.SentAt.UnixNano(),
		Exchange: r.Exchange, Regions: r.Regions, ReportId: ^uint64(0), Part: 1, Parts: 1, KeysTotal: uint32(len(r.Keys)),
	}
	head := proto.Size(hdr) + envelopeOverhead
	bytes, msgs = head, 1
	used := head
	for i := range r.Keys {
		k := &r.Keys[i]
		pk := &syncv1.Key{
			Key: k.Key, Generation: k.Generation, Base: k.Base, Row: k.Row, Taken: k.Taken,
			In: k.In, InTaken: k.InTaken, SharePpm: k.SharePPM, Demand: k.Demand, Granted: k.Granted, Settled: k.Settled,
		}
		for _, x := range k.Exits {
			pk.Exits = append(pk.Exits, &syncv1.Exit{Generation: x.Generation, Row: x.Row, Taken: x.Taken, In: x.In, InTaken: x.InTaken})
		}
		n := proto.Size(pk)
		n += 1 + sizeVarint(uint64(n))
		if used+n > maxPayload {
			msgs++
			bytes += head
			used = head
		}
		used += n
		bytes += n
	}
	return bytes, msgs
}

func sizeVarint(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
