// Package sim is ration's regional skew simulator: a deterministic
// discrete-event simulation that drives the production agent logic
// (lease/agent's Driver), the regional allocator (lease.MemoryStore behind
// the real lease/service), and the cross-region share exchange (region)
// on a virtual clock, with a modelled network and Redis, and checks the
// admitted traffic of every key against the bound of DESIGN.md. Regions
// may be served by Envoy proxies instead of agents, their RLQS streams
// planned by lease/rlqs's Core (rlqs.go).
//
// A scenario is a YAML file (see simulations/README.md); Parse validates
// it, Run simulates it with one algorithm and returns a Result whose
// Summary is what summary.json holds. Same scenario and seed, same bytes.
package sim

import (
	"errors"
	"time"

	"github.com/ration-dev/ration/internal/yamlfield"
	"github.com/ration-dev/ration/policy"
)

// Scenario is a validated simulation scenario. Durations are virtual time.
type Scenario struct {
	// Name identifies the scenario in outputs.
	Name string
	// Seed seeds every random choice of the run.
	Seed uint64
	// Duration is the simulated time.
	Duration time.Duration
	// Start is the wall-clock instant the run starts at (yaml start, RFC
	// 3339): where fixed windows fall, and the time zone offsets in force.
	// Default 2023-11-14T22:13:20Z.
	Start time.Time
	// Step is the arrival clock step: requests arriving within one step
	// are decided at its start (default 1ms).
	Step time.Duration
	// Grid is the resolution at which windows are checked against the
	// bound (default Step for up to 16 keys, else 10ms).
	Grid time.Duration
	// Sample is the time series' interval (default duration/1000, at
	// least 100ms, a multiple of Grid).
	Sample time.Duration
	// Regions are the region names, sorted.
	Regions []string
	// AgentsPerRegion is how many agents each region starts with.
	AgentsPerRegion int
	// SyncPeriod is the exchange's epoch (default 1s).
	SyncPeriod time.Duration
	// LeaseTTL is τ (default 100ms); LeasePeriod is T_lease (default 50ms).
	LeaseTTL, LeasePeriod time.Duration
	Network               Network
	Redis                 Redis
	Keys                  []KeyGroup
	Demand                []DemandStep
	Faults                []Fault
	// RLQS, when set, serves some regions' requests by Envoy proxies
	// leasing over RLQS instead of agents (yaml rlqs).
	RLQS *RLQS

	// File is where the scenario was read from, for messages.
	File string
}

// Network models NATS between regions and agent↔regiond round trips.
type Network struct {
	// Delay and Jitter: a report takes Delay ± Jitter (uniform) to
	// arrive. Loss is the chance that a report copy is lost.
	Delay, Jitter time.Duration
	Loss          float64
	// ClockSkew: each region's clock is off by a uniform [-skew, +skew],
	// which moves its epochs and the times its exchange sees.
	ClockSkew time.Duration
	// AgentRTT ± AgentJitter is an agent↔regiond round trip (default 1ms ±
	// 20%).
	AgentRTT, AgentJitter time.Duration
}

// Redis models the regional store.
type Redis struct {
	// Latency is one store round trip from regiond (default 500µs).
	Latency time.Duration
}

// KeyGroup is Count keys of one rule.
type KeyGroup struct {
	// Name is the rule's name and its key descriptor's name.
	Name string
	// Limit is the tokens a key is granted per Period; with LimitMax the
	// keys' limits are spread evenly over [Limit, LimitMax].
	Limit, LimitMax int64
	// Period is the rule's period (default 1s), as the policy reads it: a
	// token bucket's refill period, at most policy.MaxPeriod; a fixed
	// window's length, which divides a day, or for a calendar window
	// (Calendar) its nominal length. A key's rate L is its limit ÷ Period
	// tokens per second, a fraction for a long period ("100 a minute" is
	// 1.67 tokens/s).
	Period time.Duration
	// RuleAlgorithm is the rule's algorithm (yaml algorithm): TokenBucket
	// (the default) or FixedWindow. Not to be confused with a run's
	// Algorithm (escrow, static, ideal).
	RuleAlgorithm string
	// Calendar is a fixed window's calendar period (yaml period: day,
	// week, month, or 24h); "" otherwise.
	Calendar policy.Calendar
	// TimeZone is a fixed window's time_zone, an IANA name ("": UTC).
	TimeZone string
	// Burst is b in tokens (default the key's limit; a fixed window's is
	// always its limit).
	Burst int64
	// Cost is tokens per request (default 1).
	Cost int64
	// Count is the number of keys (default 1).
	Count int
	// Weight is the group's part of every region's requests, relative to
	// the other groups (default 1).
	Weight float64
	// Zipf, when > 0, spreads the group's requests over its keys with
	// P(key i) ∝ 1/(i+1)^Zipf; otherwise evenly.
	Zipf float64
	// OnError is the rule's failure mode (default local).
	OnError string
	// ReclaimAfter is the rule's partition_reclaim_after: the other
	// regions reclaim a region silent that long (0: never, fail-static).
	ReclaimAfter time.Duration
}

// The rule algorithms of a key group.
const (
	// TokenBucket refills Limit tokens per Period continuously, up to Burst.
	TokenBucket = "token_bucket"
	// FixedWindow admits Limit tokens per window of Period, aligned to the
	// calendar of TimeZone (policy.Rule.Window).
	FixedWindow = "fixed_window"
)

// defaultStart is a scenario's Start when it gives none, in Unix seconds:
// 2023-11-14T22:13:20Z.
const defaultStart = 1_700_000_000

// DemandStep sets the request rates from At on.
type DemandStep struct {
	At time.Duration
	// Ramp makes the rates change linearly from the previous step's over
	// Ramp; zero steps at once.
	Ramp time.Duration
	// Rates are requests per second per region (regions not named: 0).
	Rates map[string]float64
	// Every and AltRates, when set, alternate the rates with AltRates every
	// Every (Rates first).
	Every    time.Duration
	AltRates map[string]float64
	Line     int
}

// Fault is one injected fault, starting at At.
type Fault struct {
	At time.Duration
	// Kind is "partition", "redis_failover", "crash_agents", "add_agents",
	// "unreachable" (the region's agents cannot reach their regiond) or
	// "restart" (the regiond is down for For and comes back with the
	// exchange state it last persisted) or "policy_mismatch" (the region's
	// policy defines every rule with Factor × its limit and burst for For),
	// "crash_proxies" (Proxies RLQS proxies vanish; with For, as many new
	// ones start then) or "disconnect_proxies" (their streams break for
	// For: they enforce what they hold, then their fallback).
	Kind   string
	Region string
	// For: how long a partition, an unreachable regiond or a restart lasts; for
	// crashed agents, when they come back (0: never).
	For time.Duration
	// LostWrites: a failover loses the store's writes of this last window.
	LostWrites time.Duration
	// Fraction of the region's agents that crash.
	Fraction float64
	// Agents added (a cold-start scale-up).
	Agents int
	// Factor of a policy mismatch.
	Factor float64
	// Proxies that crash or whose streams break (crash_proxies,
	// disconnect_proxies).
	Proxies int
	Line    int
}

// ErrInvalid is wrapped by every validation error of Parse.
var ErrInvalid = errors.New("sim: invalid scenario")

// FieldError is one problem in a scenario file: "file:line: field: msg".
// Unwrap returns ErrInvalid.
type FieldError = yamlfield.Error[invalidScenario]

// Errors is every problem found in a scenario, in line order. Is reports
// ErrInvalid; errors.As(err, &fe) with fe a *FieldError finds the first.
type Errors = yamlfield.Errors[invalidScenario]

// invalidScenario makes FieldError and Errors wrap ErrInvalid.
type invalidScenario struct{}

func (invalidScenario) Sentinel() error { return ErrInvalid }

// regionIndex returns the index of a region name, or -1.
func (s *Scenario) regionIndex(name string) int {
	for i, r := range s.Regions {
		if r == name {
			return i
		}
	}
	return -1
}
