package exchange

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
)

// Store is the region's allocator store as the exchange writes it:
// lease.RedisStore and lease.MemoryStore satisfy it.
type Store interface {
	SetShares(ctx context.Context, ups []lease.ShareUpdate, out []lease.ShareResult) error
	DeleteShares(ctx context.Context, keys []string) error
	// Incarnation changes whenever the store may have lost writes; the
	// holder then writes every share again before it gives anything.
	Incarnation(ctx context.Context) (string, error)
}

// Coordinator elects the one replica of a region that runs its exchange
// (the holder) and keeps the region's persisted exchange state:
// RedisCoordinator for replicas that share a Redis, MemoryCoordinator for
// one process.
type Coordinator interface {
	// Acquire takes reg's hold for holder for ttl, or renews it.
	Acquire(ctx context.Context, reg, holder string, ttl time.Duration) (region.Hold, error)
	// Release gives the hold up if holder has it.
	Release(ctx context.Context, reg, holder string) error
	// Save stores the state, atomically, while holder holds the election;
	// otherwise its error wraps region.ErrNotHolder and nothing changes.
	Save(ctx context.Context, reg, holder string, st SavedState) error
	// Load returns the stored state, whole (Head nil when there is none).
	Load(ctx context.Context, reg string) (SavedState, error)
}

// SavedState is a region's persisted exchange state as a Coordinator keeps
// it: a head and one record per key (codec.EncodeSnapshotParts), so that
// an epoch writes the records of the keys that changed only.
type SavedState struct {
	// Whole replaces everything stored. Otherwise Head replaces the stored
	// head, Records the stored records of Keys (Records[i] is Keys[i]'s),
	// and Deleted are removed (before Records are written).
	Whole   bool
	Head    []byte
	Keys    []string
	Records [][]byte
	Deleted []string
}

// ErrNoWholeState is wrapped by Save's error for a partial state where no
// whole one was stored: nothing changes, and the next save must be whole.
var ErrNoWholeState = errors.New("exchange: no whole state stored to change")

// ErrInvalidConfig reports a Config that New cannot use.
var ErrInvalidConfig = errors.New("exchange: invalid config")

// Config configures an Exchanger. The zero value of every optional field
// selects its default; New fills the defaults on a copy and validates.
type Config struct {
	// Region is this region's name. Required; a NATS subject token
	// (no '.', '*', '>' or white space).
	Region string
	// Replica names this replica, unique within the region. Required.
	Replica string
	// Regions are all regions of the deployment, Region included, in any
	// order. Default: Region alone.
	Regions []string
	// Period is the sync period: one epoch. Default 1s; every region must
	// use the same. Epochs start at multiples of Period on the wall clock,
	// so that regions with synchronised clocks close their tallies
	// together.
	Period time.Duration
	// Refresh is region.Config.Refresh: how often, in epochs, reports list
	// a key that did not change (0: its default; -1: full reports).
	Refresh int
	// DecideAfter is how long after the start of an epoch the exchanging
	// replica decides its moves (region.State.Epoch), having published its
	// tallies at the start (region.State.Tally): long enough for every
	// region's tallies to arrive, so that all steer by the demand of the
	// period just closed. Default Period / 4; it must be below Period / 2.
	// Set it above the one-way delay between regions plus clock skew.
	DecideAfter time.Duration
	// Conn is the NATS connection reports travel on. Required; the caller
	// owns it (and should dial it with nats.MaxReconnects(-1)).
	Conn *nats.Conn
	// Subject is the subject prefix: a replica publishes on
	// "<Subject>.<Region>" and subscribes to "<Subject>.*", so an account
	// can allow each region to publish only its own. Default "ration.sync".
	Subject string
	// Store receives share writes. Required.
	Store Store
	// Coordinator elects the exchanging replica and keeps the region's
	// exchange state. Required.
	Coordinator Coordinator
	// HoldTTL is how long the region's hold lasts after each renewal (it
	// is renewed every epoch): the longest a region goes without moving
	// shares after its exchanging replica dies. Default 3 × Period; at
	// least 2 × Period.
	HoldTTL time.Duration
	// Policy returns the policy in force: each key's rule gives the rate,
	// burst, cost and partition_reclaim_after the exchange needs. Required.
	Policy func() *policy.Set
	// PolicyName, if set, names the policy in force for reports and logs
	// (regiond gives its revision in the policy store); default its
	// Version. Called once per report.
	PolicyName func() string
	// OnDisagree, if set, is called from the loop whenever the global
	// rules that a peer defines otherwise change, with all of them (none
	// once every replica heard agrees): regiond enforces the stricter
	// definition of each (policy.Set.Agreed) while its keys are held.
	// It must not block.
	OnDisagree func([]region.Disagreement)
	// WriteBatch is the most share writes sent in one store call. Default
	// 500.
	WriteBatch int
	// StoreTimeout bounds each store call. Default Period / 2.
	StoreTimeout time.Duration
	// QueueSize is how many received messages wait for the exchange's loop
	// before new ones are dropped (codec.ReasonOverflow). Default 4096.
	QueueSize int
	// Limits bound what the decoder accepts.
	Limits codec.Limits
	// TopKeys is how many of the most active keys get a share gauge per
	// region (bounded cardinality). Default 20; negative disables.
	TopKeys int
	// IdleAfter is how long a key must see no demand anywhere before it
	// retires (region.Config.IdleAfter; default 60s): more than the
	// longest gap between two requests of a key that should stay held.
	IdleAfter time.Duration
	// Tune, if set, adjusts the region.Config the exchange builds (Self,
	// Replica, Regions, Period, IdleAfter and Policy are set before it is
	// called), for tests and deployments that change region's defaults.
	Tune func(*region.Config)
	// Registerer receives the exchange's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock defaults to time.Now. The loop reads it, and so does a scrape
	// of ration_exchange_peer_lag_seconds.
	Clock func() time.Time
}

func (c Config) withDefaults() Config {
	if len(c.Regions) == 0 && c.Region != "" {
		c.Regions = []string{c.Region}
	}
	c.Regions = slices.Clone(c.Regions)
	slices.Sort(c.Regions)
	if c.Period == 0 {
		c.Period = time.Second
	}
	if c.DecideAfter == 0 {
		c.DecideAfter = c.Period / 4
	}
	if c.Subject == "" {
		c.Subject = "ration.sync"
	}
	if c.HoldTTL == 0 {
		c.HoldTTL = 3 * c.Period
	}
	if c.WriteBatch == 0 {
		c.WriteBatch = 500
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = c.Period / 2
	}
	if c.QueueSize == 0 {
		c.QueueSize = 4096
	}
	if c.TopKeys == 0 {
		c.TopKeys = 20
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	return c
}

func subjectToken(s string) bool {
	return s != "" && !strings.ContainsAny(s, ".*> \t\r\n")
}

// Validate reports whether c, with its defaults filled, is usable by New.
// The error wraps ErrInvalidConfig.
func (c Config) Validate() error { return c.withDefaults().validate() }

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case !subjectToken(c.Region):
		return bad("Region %q is not a NATS subject token", c.Region)
	case c.Replica == "":
		return bad("Replica is empty")
	case !slices.Contains(c.Regions, c.Region):
		return bad("Regions %v do not include Region %q", c.Regions, c.Region)
	case c.Conn == nil:
		return bad("Conn is nil")
	case c.Store == nil:
		return bad("Store is nil")
	case c.Coordinator == nil:
		return bad("Coordinator is nil")
	case c.Policy == nil:
		return bad("Policy is nil")
	case c.Period < time.Millisecond:
		return bad("Period %v is below 1ms", c.Period)
	case c.DecideAfter < 0 || 2*c.DecideAfter >= c.Period:
		return bad("DecideAfter %v is not in [0, Period/2)", c.DecideAfter)
	case c.HoldTTL < 2*c.Period:
		return bad("HoldTTL %v is below 2 × Period", c.HoldTTL)
	case c.WriteBatch < 1, c.QueueSize < 1:
		return bad("WriteBatch and QueueSize must be positive")
	case c.StoreTimeout <= 0:
		return bad("StoreTimeout %v is not positive", c.StoreTimeout)
	}
	for i, r := range c.Regions {
		if !subjectToken(r) {
			return bad("region %q is not a NATS subject token", r)
		}
		if i > 0 && c.Regions[i-1] == r {
			return bad("region %q listed twice", r)
		}
	}
	for _, tok := range strings.Split(c.Subject, ".") {
		if !subjectToken(tok) {
			return bad("Subject %q is not a literal NATS subject", c.Subject)
		}
	}
	return nil
}
