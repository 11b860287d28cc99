// Package exchange carries the cross-region exchange of ration over NATS:
// the edge around the deterministic core in package region (DESIGN.md,
// "Level 2" and "Replicas of one region").
//
// Reports and the persisted exchange state travel in the wire format of
// package sync/codec, which classifies every message it drops by
// codec.Reason.
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
