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
// Two wire versions are read: V1 writes each key as a Key message, V2 (the
// Latest) as columns, about a quarter of the bytes. Every part says the
// newest version its sender reads; during a rolling upgrade a sender writes
// V1 until every peer it hears reads V2:
//
//	v := a.WriteVersion(now, peerRegions, 2*period)
//	msgs, err := codec.EncodeReportVersion(&rep, id, maxPayload, v)
//
// EncodeSnapshot and DecodeSnapshot do the same for the exchange state a
// region persists in its store.
package codec
