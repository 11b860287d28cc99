// Package exchange carries the cross-region exchange of ration over NATS:
// the edge around the deterministic core in package region (DESIGN.md,
// "Level 2" and "Replicas of one region").
//
// The codec (EncodeReport, DecodePart, Assembler) turns a region.Report
// into checksummed protobuf messages (sync/v1) no larger than the
// connection's max_payload, and back, dropping and classifying by Reason
// anything corrupt, truncated, oversized, duplicated, replayed or
// inconsistent. EncodeSnapshot and DecodeSnapshot do the same for the
// region's persisted exchange state.
//
// An Exchanger is one regiond replica's runtime. Start it with a NATS
// connection, the region's store and a Coordinator (the store's exchange
// lease), hook Observe and InitialShare into lease/service, and Close it:
//
//	x, err := exchange.New(exchange.Config{
//		Region: "eu", Replica: "eu-1", Regions: []string{"us", "eu", "ap"},
//		Conn: nc, Store: redisStore, Coordinator: redisStore, Policy: svc.Policy,
//	})
//	...
//	if err := x.Start(); err != nil { ... }
//	defer x.Close(ctx)
//
// Each sync period the replica that holds its region's exchange lease runs
// the epoch: it lowers shares in the store, commits the gifts, persists the
// state (fenced by the lease), publishes the report on
// "ration.sync.<region>" and raises the shares it received. The other
// replicas publish their demand tallies, which every region sums. A replica
// that takes the lease over restores the persisted state first, so nothing
// is lost or given twice. Every write of the holder is sent with a deadline
// before its lease could lapse, so a paused or partitioned holder never
// writes after another has taken over.
package exchange
