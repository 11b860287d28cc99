// Package codec is the wire format of the cross-region exchange: it turns
// a region.Report into checksummed sync/v1 messages no larger than a NATS
// connection's max_payload, and back. It needs no NATS, so the exchange
// (sync/exchange) and the simulator share its code and its sizes.
//
// A sender encodes each report; Size counts the same messages without
// encoding them:
//
//	msgs, err := codec.EncodeReport(&rep, id, maxPayload)
//	bytes, n, err := codec.Size(&rep, id, maxPayload)
//
// A receiver decodes each message and reassembles the parts:
//
//	a := codec.NewAssembler(codec.AssemblerConfig{})
//	p, err := codec.DecodePart(msg, codec.Limits{})
//	rep, err := a.Add(now, p) // nil until the report is complete
//
// Anything corrupt, truncated, oversized, duplicated, replayed or
// inconsistent is a *DropError whose Reason (ReasonOf) says why.
//
// Three wire versions are read: V1 writes each key as a Key message, V2 as
// columns, about a quarter of the bytes, and V3 (the Latest) as V2's
// columns with a name that differs from the previous one only in its
// trailing number written as the number's step, a tally's share relative
// to the initial share, and rows by their entries that are not zero
// (columns.go), about 0.6 of V2's delta reports. Every part says the
// newest version its sender reads; during a rolling upgrade a sender
// writes the newest version that every peer it hears reads (V1 until it
// has heard every peer region), and among those the one that makes each
// report smallest:
//
//	v := a.WriteVersion(now, peerRegions, 2*period)
//	msgs, err := codec.EncodeReportUpTo(&rep, id, maxPayload, v)
//
// EncodeSnapshot and DecodeSnapshot do the same for the exchange state a
// region persists in its store.
package codec
