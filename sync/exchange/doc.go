// Package exchange runs the cross-region exchange of ration over NATS: the
// edge around region.Node, which holds the protocol (docs/DESIGN.md,
// "Level 2" and "The exchange protocol, as built"). Reports and the
// persisted state travel in the wire format of sync/codec.
//
// An Exchanger is one regiond replica's runtime. Give it a NATS connection,
// the region's store and a Coordinator (the holder election and persisted
// state: NewRedisCoordinator on the region's Redis, NewMemoryCoordinator in
// one process), hook Observe and InitialShare into lease/service, Start it
// and Shutdown it:
//
//	x, err := exchange.New(exchange.Config{
//		Region: "eu", Replica: "eu-1", Regions: []string{"us", "eu", "ap"},
//		Conn: nc, Store: redisStore, Coordinator: exchange.NewRedisCoordinator(redisStore),
//		Policy: svc.Policy,
//	})
//	...
//	if err := x.Start(); err != nil { ... }
//	defer x.Shutdown(ctx)
//
// Each sync period every replica renews or takes its region's hold; the
// holder runs the epoch and the others publish their demand tallies. Every
// write of the holder has a deadline before its hold could lapse, so a
// paused or partitioned holder never writes after another has taken over.
package exchange
