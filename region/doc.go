// Package region is the deterministic core of the cross-region exchange of
// quota shares (DESIGN.md, "Level 2"): one region's share state for all its
// global keys, and the decisions that move share toward demand without ever
// letting the shares of a key sum above 1.
//
// It does no I/O, starts no goroutine and reads no clock. Like etcd's raft
// RawNode, a State is a synchronous state machine: the caller (regiond's
// sync loop, or the simulator) feeds it local tallies and peers' reports,
// asks it for one epoch's decisions, carries out the store writes it
// returns, and publishes the report it produces.
//
// # Using it
//
//	st, err := region.New(region.Config{Self: "eu", Regions: []string{"eu", "us"}})
//	st.Observe(region.GlobalKey(rule, key), demand, granted) // per lease batch
//	st.Receive(now, report)                                   // per peer report
//	write st.Apply()                                          // gifts received
//	publish st.Tally(now)                                     // once per Period
//	plan := st.Epoch(now)                                     // Period/4 later
//	write plan.Lower to the store; keep only the confirmed entries
//	st.Commit(plan)                                           // the gifts are given here
//	persist st.Snapshot() in the region's store               // if it fails, stop here
//	publish st.Report()
//	write plan.Raise; delete the share of plan.Retire keys
//
// The order is the safety argument. A gift is given when Commit records it
// in our row, after the share it comes out of was lowered in the store
// (Lower); a Lower entry whose write is not confirmed is removed, and its
// key gives nothing this epoch. The snapshot is persisted before the report
// that announces the gift, so a replica that takes over (or a restart)
// never forgets a gift a peer may have seen. Raise entries may fail
// harmlessly (call Resync). A plan that is never committed gives nothing;
// the next Epoch rewrites the shares it touched before any gift.
//
// Only the replica holding the region's exchange lease runs Epoch and
// Receive. The other replicas call Observe and Tally and publish tally-only
// reports, which the exchanging replica sums with its own tallies; a replica
// that takes the lease over calls Restore with the persisted snapshot.
// `scope: region` rules are not exchanged: their keys have share PPM in
// every region and are never passed to Observe.
//
// # The escrow
//
// Per key and generation (below), region i keeps the cumulative gifts
// G[i][j] it has made to each region j, in integer ppm; only i writes row i,
// and counters only grow. Its share is
//
//	s_i = base_i + Σ_k G[k][i] − Σ_j G[i][j]   (+ reclaims, below)
//
// where base_i is its share when it entered the generation (its initial
// share, Config.Initial, for a key it held no state for). Region i knows its
// own row exactly and can only be behind on gifts to it, so every region's
// computed share is at most its true share, and the applied shares sum to
// at most PPM under any loss, delay, duplication or reordering of reports.
// Reports carry whole rows and merging takes the maximum, so receiving is
// idempotent and order-free; a report not newer than the last one from its
// replica is ErrStale, and one whose counters went down is ErrRegressed.
//
// # Each epoch
//
// Epoch smooths each region's demand with an EWMA (Config.Alpha). Every
// region steers by the tallies all regions published for the epoch (its
// own included), so that all compute the same targets. An epoch has two
// phases: Tally closes the local tallies and returns a tally-only report to
// publish at once; Epoch, called a fraction of a period later when every
// region's tallies have arrived, decides (without a Tally before it, Epoch
// closes the tallies itself and steers by those published the epoch
// before, a period older). A region not heard keeps its smoothed demand,
// and restarts from its latest tally once heard again. The EWMA's weight is
// Alpha scaled by n/(n+4) for a region seeing n requests an epoch (its
// tally or its smoothed demand, the larger), so that a few requests an
// epoch, whose count is mostly Poisson noise, barely move a key's shares,
// while thousands are followed at nearly Alpha; and by a third while a
// region's demand keeps turning (it turned at the last epoch and again at
// this one), which is demand oscillating faster than shares can follow:
// chasing it would give share away half a cycle late. A step, even one
// reversed later, is followed at full weight. Needs are demand per second
// over the key's rate L (Config.Policy), plus one standard deviation of
// that noise where it exceeds FloorPPM, and Targets divides the quota by
// max-min water-filling.
//
// Peers heard within StaleAfter are live. Those in our generation receive
// gifts; those about to join it (no state yet, or another generation) take
// part in the water-filling but receive nothing until they have joined.
// Peers not heard are frozen at their last known share: fail-static, they
// neither give nor receive, and the water-filling divides what is left. A
// region above its target gives its surplus to the live peers below target
// in proportion to their deficits; when every giver does so with the same
// view, each deficit is filled exactly by the next epoch. Surpluses below
// MinTransferPPM are not moved. A receiver applies gifts as they arrive
// (Apply), not at its next epoch. Convergence: a change of demand is in the
// tallies at the end of its epoch, acted on a fraction of a period later,
// and the gifts are in use a network delay after that; with α = 0.9 the
// shares are within 5% of PPM of the targets one or two periods after a
// change of demand (TestScenarioDemandShift, which allows three), and within
// three periods after faults end (TestPropertyEscrow, generation changes
// included).
//
// # Generations and idle keys
//
// A key's exchange state lives in a generation: a number taken from the
// epoch when a region creates it. A region enters the newest generation its
// peers are in, and follows any peer to a newer one, carrying its share over
// as the new base (minus the reclaims its victims have not acknowledged).
// It never enters a generation at or below one it has left (a per-key floor,
// and a per-region floor once the key is forgotten, both persisted), so
// counters of an older generation are never merged into a newer one and a
// forgotten row is never counted twice. Leaving a generation loses nothing
// in flight: a region announces an exit record (its final row, and the gifts
// and reclaims it had applied) until every peer has acknowledged settling
// against it; a giver takes back what the leaver never applied, a reclaimer
// what its victim did apply.
//
// A key with no demand anywhere for IdleAfter is idle (a silent region that
// had demand counts as having it still): targets become the initial shares,
// so share flows back to where it started. A region retires the key when
// its share is back at its initial share (or it is sure no peer is below
// its own), nothing was transferred for Grace, every gift it made was
// acknowledged (reports carry In, the gifts applied), and every peer in its
// generation is heard. It then drops the key's state (Plan.Retire: the
// store share is deleted and the bucket uses the initial share), keeps a
// small tombstone while its exit record is announced, and is forgotten
// after that. A region also keeps a key that a peer still exchanges, to
// join its generation when demand comes back. Memory follows the keys
// active somewhere, plus tombstones for at least Grace (up to
// 10 × IdleAfter while a peer cannot acknowledge), plus, during a
// partition, the keys the silent region shared.
//
// # Partitions and reclaim
//
// A region that hears nobody keeps its share: its peers are frozen, it gives
// nothing and receives nothing, and its peers cannot take its share. This
// adds nothing to the bound of DESIGN.md.
//
// A key whose policy sets ReclaimAfter (the rule's partition_reclaim_after)
// lets the others reclaim a region in their generation that was silent that
// long: each takes ⌊(s_j − FloorPPM) / (n − 1)⌋ of the silent region's
// share as they last saw it, once per generation, recorded in its own
// reclaim row R[i][j] (Report.Keys[].Taken); s_i gains it, s_j loses it once
// j hears of it. While the silent region still spends what was taken, the
// shares of the key sum to more than PPM by at most
//
//	E_reclaim ≤ Σ_i Σ_j R[i][j] ≤ s_j − FloorPPM   (per silent region j)
//
// in ppm of L, for as long as region j has not heard the reclaim. A region
// that hears nobody sees everyone silent and reclaims from all of them, so
// in a partition both sides reclaim: the overshoot is that sum over every
// region some other region considers silent, at most PPM − n × FloorPPM
// (TestScenarioReclaim). The property test checks Σ ≤ PPM + the reclaims
// held (plus, for a region that has not yet written its lowered share, the
// difference). Reclaims based on
// a stale view can take more than the victim had: its share goes negative,
// its store holds 0, and the excess stays within the same bound until the
// others' gifts make it whole. A generation change ends a reclaim: the
// reclaimer keeps what the victim acknowledged and gives up the rest.
//
// # Region set changes
//
// Reports name their regions (Report.Regions) and receivers map columns by
// name, so regions with different region sets exchange during a rolling
// change; a report from a region not configured is ErrUnknownRegion. The
// shares stay valid as long as Σ over running regions of the initial share
// each one uses is at most PPM. So: a joining region is added to Regions
// with Config.Initial giving it 0 (the others' initial shares unchanged);
// it joins the keys' generations at 0 and receives gifts like any hungry
// region. A leaving region is removed from Regions; Restore folds its
// counters into the base, so no share changes, and its own share is lost
// until an operator raises the others' initial shares by at most its
// initial share, after it has stopped. A change of a rule's L or burst needs
// nothing: shares are fractions.
//
// # What this package does not protect against
//
// A region that loses its persisted snapshot (store data loss) can give the
// same share twice; peers see its row go down (ErrRegressed). This is the
// E_fault of DESIGN.md. (sync/exchange keeps the exchanging replica's State
// through a store data loss, so it takes losing that replica too.) Share can be lost (never created) by a gift or exit
// record that no report carries before a peer stops waiting for it (after
// 10 × IdleAfter); the key then runs below PPM until it retires everywhere.
//
// # Deviations from the suggested shape
//
// Plan has no Report: Report is a method reading committed state, so a
// report can never announce a gift that was not committed, and it carries
// this epoch's gifts (built after Commit) instead of last epoch's, which
// saves an epoch of convergence. Reports also carry Base, In, Exits and
// Settled, which the generation and acknowledgement rules need. The rule's
// rate and partition_reclaim_after come from Config.Policy rather than
// Observe, because regions with no local demand need them too. Targets takes
// the total and needs in ppm, so it serves the frozen-peer case as well.
package region
