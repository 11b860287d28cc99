package region

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// PPM is one whole share in parts per million; it equals region.PPM. Shares
// and gift counters are integers so that sums of shares are exact.
const PPM = 1_000_000

// maxRegions bounds len(Config.Regions): per-key region sets are bit masks.
const maxRegions = 64

// Sentinel errors. Functions wrap them with %w and detail; match with
// errors.Is.
var (
	// ErrInvalidConfig reports a Config that New cannot use.
	ErrInvalidConfig = errors.New("region: invalid config")
	// ErrMalformed reports a Report or Snapshot that breaks its documented
	// shape: a row of the wrong length, a negative counter, a share out of
	// range, an exit record for a generation that is not older. Receive
	// and Restore change nothing when they return it.
	ErrMalformed = errors.New("region: malformed")
	// ErrUnknownRegion reports a Report from a region that is not in
	// Config.Regions (during a rolling change of the region set), or a
	// Snapshot of another region. Nothing is changed.
	ErrUnknownRegion = errors.New("region: unknown region")
	// ErrRegressed reports a Report in which a counter of a generation
	// already known went down: the sender lost state it had published (a
	// store data loss). The whole report is ignored; the larger values
	// already merged stay.
	ErrRegressed = errors.New("region: counter regressed")
	// ErrStale reports a Report whose Epoch is not newer than the last one
	// of the same kind (tally-only or exchange) received from the same
	// replica: a duplicate or a reordered message.
	// It is routine on an at-least-once transport; nothing is changed.
	ErrStale = errors.New("region: stale report")
	// ErrStalePlan reports a Commit of a Plan that is not the latest one
	// returned by Epoch, or that was already committed. Nothing is given.
	ErrStalePlan = errors.New("region: stale plan")
	// ErrInvalidPlan reports a Commit of a Plan whose Lower or Raise entries
	// were not produced by Epoch (edited keys or values). Nothing is given.
	ErrInvalidPlan = errors.New("region: invalid plan")
)

// KeyPolicy is what the exchange needs to know about one key from the
// policy (DESIGN.md, "Policy"). It is looked up through Config.Policy at
// every epoch, so a policy change takes effect at the next epoch; shares
// are fractions, so a change of L or b never invalidates them.
type KeyPolicy struct {
	// Rule names the key's rule (RuleDef.Name); "" for a key whose rule is
	// unknown, which is never held for a disagreement.
	Rule string
	// Rate is the key's global rate L in tokens per second. Demand is
	// converted to a need in ppm as demand per second / Rate. A Rate that
	// is not positive (an unknown rule) makes needs relative: each region's
	// need is its fraction of the key's total demand.
	Rate float64
	// ReclaimAfter is the rule's partition_reclaim_after: after this long
	// without hearing a region, the others take its share above FloorPPM
	// (see the package documentation for the overshoot that admits). Zero
	// disables reclaiming (fail-static: a silent region keeps its share).
	ReclaimAfter time.Duration
	// Cost is the tokens one request takes (the rule's cost; 1 when not
	// positive). Demand is counted in tokens, but its noise in requests:
	// a region that sees a few requests an epoch is smoothed harder and
	// given more headroom than one that sees thousands.
	Cost float64
	// Burst is the key's global burst b in tokens: a gift of share s moves
	// at most b × s of the tokens the giver's store released with it (what
	// that share holds in a full bucket). Zero moves no tokens.
	Burst float64
	// FixedWindow marks a fixed window's key: its bucket does not refill
	// within a window, so it absorbs no demand noise over a horizon of
	// epochs (bucketHorizon) the way a token bucket does.
	FixedWindow bool
}

// Config configures a State. The zero value of every optional field selects
// its default; New fills the defaults on a copy and validates.
type Config struct {
	// Self is this region's name. Required; must be in Regions.
	Self string
	// Replica is this replica's name, unique within the region. Reports
	// from the same region and replica are this replica's own echo and are
	// ignored. Default "0".
	Replica string
	// Regions are all regions of the deployment, sorted, without
	// duplicates, Self included; at most 64. Rows of gift counters are
	// indexed like it.
	Regions []string
	// Initial is each region's initial share in ppm: the share of a key
	// that has no exchange state (the allocator's InitialShare). Regions
	// missing from a non-nil map start at 0, which is how a joining region
	// is added (see "Region set changes" in the package documentation).
	// The values must be non-negative and sum to at most PPM. Default (nil):
	// PPM split equally over Regions, the first regions taking the
	// remainder.
	Initial map[string]int64
	// Period is the epoch period: reports carry demand per epoch, and a
	// generation number is an epoch number. All regions must use the same
	// Period. Default 1s.
	Period time.Duration
	// Alpha is the weight of the newest epoch in the demand EWMA, in (0, 1].
	// Default 0.9: fast both ways (DESIGN.md, "Each epoch", step 3, says
	// about 0.8). A change of demand that falls late in an epoch is only
	// partly in that epoch's tally; with 0.9 the smoothed demand is within
	// 1% + 9% × that part of the change one epoch later, which keeps
	// convergence within three periods (0.8 takes a fourth when the change
	// falls in the last quarter of an epoch). Lower it for noisy demand.
	Alpha float64
	// FloorPPM is the headroom a region gets on top of its need when it
	// needs less than the water level, and the share a silent region keeps
	// when its share is reclaimed. At most PPM/len(Regions). Default 5,000
	// (0.5% of the key's quota): a region whose demand appears from nothing
	// can serve 0.5% of L at once, until the next epoch moves share to it
	// (a period or two). Headroom given to a region that does not use it
	// is lost while others are hungry: at 2%, three regions under steady
	// demand above L used 95% of it in the simulator, at 0.5% 99%.
	FloorPPM int64
	// MinTransferPPM is the smallest surplus worth giving away; smaller
	// moves are dust that would only churn the store. Ignored while a key is
	// idle, where exact moves back to the initial shares let it retire.
	// Default 1,000 (0.1%).
	MinTransferPPM int64
	// SettledPPM: a key whose every live region holds at least its ask
	// (need plus headroom) moves no share while every share is within
	// SettledPPM of its target for the demand itself, without the
	// headroom (docs/DESIGN.md, "Settled keys"), rather than following
	// each move of its targets, most of which, for keys of a few requests
	// an epoch, are noise. A key without a rate (relative needs, which
	// no share can hold whole) moves none while every share is within
	// SettledPPM of its target. Below the convergence tolerance the tests
	// and the simulator measure (50,000). Default 40,000; negative: keys
	// follow their targets always.
	SettledPPM int64
	// StaleAfter is how long a region (or a replica's tallies) counts as
	// heard after its last report. A region not heard for StaleAfter is
	// frozen: it neither gives nor receives, and its share is left out of
	// the water-filling. Default 3 × Period.
	StaleAfter time.Duration
	// IdleAfter is how long a key must have had no demand anywhere before
	// it starts retiring: targets become the initial shares, so share flows
	// back to where it started. Default 60s.
	IdleAfter time.Duration
	// Grace is how long an idle key must see no transfer before a region
	// retires it, and the least time a region announces the exit record of
	// a generation it left (it goes on until every peer acknowledged it, at
	// most 10 × IdleAfter). Default 10s.
	Grace time.Duration
	// HoldDemand publishes a key's demand only when it moved beyond its
	// Poisson noise (a CUSUM, docs/DESIGN.md "Reports are deltas"), rather
	// than whenever an epoch's tally differs from the last published: far
	// fewer entries for keys of noisy demand, at the price of every region
	// steering by a demand up to about a noise width off, which moves
	// the simulator's figures (sync-burst's bound ratio 0.70 to 0.84,
	// follow-the-sun's utilization 99.0% to 98.8%). Default off.
	HoldDemand bool
	// EveryKey runs every key's epoch in every Epoch (and closes every
	// key's tally in every Tally). By default a key
	// whose epoch changed nothing rests until something it reads changes
	// (docs/DESIGN.md, "Keys at rest"), which changes no decision: the
	// tests compare the two, and EveryKey is the reference to compare
	// with when in doubt.
	EveryKey bool
	// Rewrite is how old the latest write of a key's applied share may grow
	// before the next epoch writes it to the store again: a store that
	// forgets a share ShareTTL after its latest write (lease.RedisConfig,
	// 24h by default), so that shares outlive no key, never forgets one the
	// exchange relies on. Keep it under half the store's ShareTTL. Default
	// 6h; negative: never.
	Rewrite time.Duration
	// Refresh is how often, in epochs, reports list a key whose state and
	// demand have not changed. Reports are deltas: each lists the keys that
	// changed since the replica's previous one (its exchange state, or its
	// demand beyond the noise) and 1/Refresh of the others, so that their
	// size follows change rather than the keys held. A receiver that
	// missed a delta asks for it again (Report.Resend); the refresh repairs
	// whatever that misses within Refresh epochs. Default 600 (ten minutes
	// at the default Period); at most 3,600. Negative: full reports every
	// epoch, which releases before deltas read (every region must
	// understand deltas before any sends them).
	Refresh int
	// Policy returns the policy of a key. It is called during Epoch, must
	// be deterministic for the simulator, and must not call into the State.
	// Default: Rate 0 (relative needs) and no reclaim for every key.
	Policy func(key string) KeyPolicy
	// Rules returns the policy this replica enforces, by a name for logs
	// (a revision or version), and its global rules' definitions, which
	// every report carries: a rule that a peer defines otherwise is held
	// (Disagreements). Called at every report and Epoch; it must be
	// deterministic for the simulator. Default: none (no rule is ever
	// held, and reports say nothing of the policy).
	Rules func() (policy string, defs []RuleDef)
}

// withDefaults returns a copy of c with every zero optional field set to its
// default. The Regions slice and Initial map are copied, so that the caller
// may reuse its own.
func (c Config) withDefaults() Config {
	if c.Replica == "" {
		c.Replica = "0"
	}
	c.Regions = slices.Clone(c.Regions)
	if c.Initial != nil {
		m := make(map[string]int64, len(c.Initial))
		for k, v := range c.Initial {
			m[k] = v
		}
		c.Initial = m
	}
	if c.Period == 0 {
		c.Period = time.Second
	}
	if c.Alpha == 0 {
		c.Alpha = 0.9
	}
	if c.SettledPPM == 0 {
		c.SettledPPM = 40_000
	}
	if c.FloorPPM == 0 {
		c.FloorPPM = 5_000
		if n := int64(len(c.Regions)); n > 0 && c.FloorPPM > PPM/n {
			c.FloorPPM = PPM / n
		}
	}
	if c.MinTransferPPM == 0 {
		c.MinTransferPPM = 1_000
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = 3 * c.Period
	}
	if c.IdleAfter == 0 {
		c.IdleAfter = 60 * time.Second
	}
	if c.Grace == 0 {
		c.Grace = 10 * time.Second
	}
	if c.Policy == nil {
		c.Policy = func(string) KeyPolicy { return KeyPolicy{} }
	}
	if c.Rewrite == 0 {
		c.Rewrite = 6 * time.Hour
	}
	switch {
	case c.Refresh == 0:
		c.Refresh = 600
	case c.Refresh < 0:
		c.Refresh = -1
	}
	return c
}

// Validate reports whether c, with its defaults filled, is usable by New.
// The error wraps ErrInvalidConfig and names the field.
func (c Config) Validate() error {
	_, err := c.withDefaults().initialShares()
	return err
}

// initialShares validates a defaulted config and returns the initial shares
// indexed like Regions.
func (c Config) initialShares() ([]int64, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	n := len(c.Regions)
	switch {
	case n == 0:
		return nil, bad("Regions is empty")
	case n > maxRegions:
		return nil, bad("Regions has %d regions, more than %d", n, maxRegions)
	case c.Self == "":
		return nil, bad("Self is empty")
	}
	for i, r := range c.Regions {
		if r == "" {
			return nil, bad("Regions[%d] is empty", i)
		}
		if i > 0 && c.Regions[i-1] >= r {
			return nil, bad("Regions is not sorted without duplicates at %q", r)
		}
	}
	if _, ok := slices.BinarySearch(c.Regions, c.Self); !ok {
		return nil, bad("Self %q is not in Regions", c.Self)
	}
	switch {
	case c.Period < time.Millisecond:
		return nil, bad("Period %v is below 1ms", c.Period)
	case !(c.Alpha > 0 && c.Alpha <= 1) || math.IsNaN(c.Alpha):
		return nil, bad("Alpha %v is not in (0, 1]", c.Alpha)
	case c.FloorPPM < 0 || c.FloorPPM > PPM/int64(n):
		return nil, bad("FloorPPM %d is not in [0, %d]", c.FloorPPM, PPM/int64(n))
	case c.SettledPPM > PPM:
		return nil, bad("SettledPPM %d is above %d", c.SettledPPM, PPM)
	case c.MinTransferPPM < 0 || c.MinTransferPPM > PPM:
		return nil, bad("MinTransferPPM %d is not in [0, %d]", c.MinTransferPPM, PPM)
	case c.StaleAfter < 0:
		return nil, bad("StaleAfter %v is negative", c.StaleAfter)
	case c.IdleAfter < 0:
		return nil, bad("IdleAfter %v is negative", c.IdleAfter)
	case c.Grace < 0:
		return nil, bad("Grace %v is negative", c.Grace)
	case c.Refresh > maxRefresh:
		return nil, bad("Refresh %d is above %d", c.Refresh, maxRefresh)
	}
	init := make([]int64, n)
	if c.Initial == nil {
		for i := range init {
			init[i] = PPM / int64(n)
			if int64(i) < PPM%int64(n) {
				init[i]++
			}
		}
		return init, nil
	}
	var sum int64
	for r, v := range c.Initial {
		i, ok := slices.BinarySearch(c.Regions, r)
		if !ok {
			return nil, bad("Initial names %q, which is not in Regions", r)
		}
		if v < 0 || v > PPM {
			return nil, bad("Initial[%q] = %d is not in [0, %d]", r, v, PPM)
		}
		init[i] = v
		sum += v
	}
	if sum > PPM {
		return nil, bad("Initial sums to %d, more than %d", sum, PPM)
	}
	return init, nil
}
