// Package region is the deterministic core of the cross-region exchange of
// quota shares (docs/DESIGN.md, "Level 2" and "The exchange, as built"):
// State, one region's share state for all its global keys and the decisions
// that move share toward demand without ever letting the shares of a key sum
// above 1; and Node, the protocol that carries those decisions to the
// region's store, its persisted state and the network, in the order the
// safety argument needs. Neither does I/O, starts a goroutine or reads a
// clock.
//
// A caller (regiond's sync/exchange, or the simulator) makes a Node with
// its Effects and drives it:
//
//	n, err := region.NewNode(region.Config{Self: "eu", Regions: []string{"eu", "us"}}, effects)
//	n.Hold(ctx, hold)          // each epoch: what the holder election said
//	n.Observe(key, demand, granted)
//	n.Tally(ctx, now)          // each epoch: publishes the tallies
//	n.Decide(ctx, now)         // Period/4 later, on the holder
//	n.Receive(ctx, now, &rep)  // each report received
//
// The Node calls the Effects (write shares, persist, publish, ...) in their
// required order; the caller never orders them itself.
package region
