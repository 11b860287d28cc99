// Package envoyrls serves Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService) from a ration agent, so that
// Envoy, Istio and other Envoy-based gateways use ration with no code.
//
// Each Envoy descriptor becomes one ration decision: its entries become
// ration descriptors, plus the request's domain under DomainKey (default
// "domain"), so rules can match `domain: edge`. hits_addend (the
// descriptor's, else the request's, default 1) is the number of hits.
// The descriptor's keys, in order, go under KeysKey (default "envoy.keys"),
// so that rules converted from Envoy's own configuration
// (policy/envoyimport, `ration policy import-envoy`) match descriptors of
// their node's depth only. The response is OVER_LIMIT when any descriptor
// is denied.
//
// A shadow rule that would deny answers OK, as Envoy's shadow_mode does;
// the agent counts it under path SHADOW and the adapter in
// ration_envoyrls_shadow_descriptors_total. The response carries the
// tightest decision's RateLimit-Policy and RateLimit fields (the IETF
// httpapi ratelimit-headers draft), X-RateLimit-* and, when denied,
// Retry-After in response_headers_to_add, the fields the HTTP middleware
// (httplimit) writes, for Envoy to pass to the client.
//
// A descriptor's limit override (RateLimitDescriptor.limit) is honoured
// only when the policy allows it: it becomes the descriptor LimitKey
// (default "envoy.limit") with a value such as "100/minute" when a rule
// with allow_descriptor_limit: true matches that value and has that limit
// and period; otherwise it is ignored and counted. Either way every other
// rule that applies still decides, so an override can add a limit the
// policy declared, never lift one. A rule's replaces reaches across the
// request's descriptors, as Envoy's does: a descriptor whose every rule is
// replaced by another descriptor's rule is answered OK without a decision.
//
// Fail-closed rules: when a rule with on_error: closed cannot reach its
// region, ShouldRateLimit returns codes.Unavailable rather than OVER_LIMIT,
// because the client is not over its quota. Configure Envoy's rate limit
// filter with failure_mode_deny: true and status_on_error: 503 so that such
// requests get a 503, as with the HTTP middleware.
//
// Envoy decides each descriptor on its own, and so does this adapter: a
// request whose first descriptor is admitted and second denied has spent the
// first's tokens. (Within one descriptor every matching ration rule must
// pass, and tokens are debited only when all pass.)
package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/policy/envoydesc"
	"github.com/ration-dev/ration/policy/envoyimport"
)

// Decider makes ration decisions; *agent.Agent is one.
type Decider interface {
	Allow(ctx context.Context, ds []policy.Descriptor, hits int64) agent.Decision
}

// ErrInvalidConfig is wrapped by New's error when the Config is invalid.
var ErrInvalidConfig = errors.New("envoyrls: invalid config")

// Config configures a Server. Zero values mean the defaults.
type Config struct {
	// DomainKey is the descriptor key under which the request's domain is
	// passed to ration (default "domain"; "-" passes no domain).
	DomainKey string
	// MaxDescriptors bounds the descriptors of one request (default 64).
	MaxDescriptors int
	// MaxEntries bounds the entries of one descriptor (default 32).
	MaxEntries int
	// MaxHits bounds hits_addend (default 1,000,000): a larger value is a
	// client bug, not a request.
	MaxHits int64
	// KeysKey is the descriptor key under which an Envoy descriptor's entry
	// keys are passed, in order (envoyimport.AppendKeys; default
	// "envoy.keys"; "-" passes none).
	KeysKey string
	// LimitKey is the descriptor key under which an allowed limit override
	// is passed (default "envoy.limit"; "-" ignores every override).
	LimitKey string
	// OmitHeaders leaves response_headers_to_add empty (default false: the
	// tightest decision's rate-limit fields are added).
	OmitHeaders bool
	// Registerer receives the adapter's metrics (ration_envoyrls_...); nil
	// registers none.
	Registerer prometheus.Registerer
}

// withDefaults returns a copy of c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.DomainKey == "" {
		c.DomainKey = envoydesc.DefaultDomainKey
	}
	if c.MaxDescriptors == 0 {
		c.MaxDescriptors = 64
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = 32
	}
	if c.MaxHits == 0 {
		c.MaxHits = 1_000_000
	}
	if c.KeysKey == "" {
		c.KeysKey = envoyimport.KeysKey
	}
	if c.LimitKey == "" {
		c.LimitKey = envoyimport.LimitKey
	}
	return c
}

// Validate reports whether c, with its defaults filled, is usable by New.
// The error wraps ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.MaxDescriptors < 0 || c.MaxEntries < 0 || c.MaxHits < 0 {
		return fmt.Errorf("%w: limits must not be negative", ErrInvalidConfig)
	}
	return nil
}

// Server implements rlsv3.RateLimitServiceServer. Safe for concurrent use.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	dec Decider
	pol PolicySource // nil when dec is not one
	cfg Config
	m   *metrics
}

// New returns a Server deciding with d.
func New(d Decider, cfg Config) (*Server, error) {
	if d == nil {
		return nil, errors.New("envoyrls: nil Decider")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: registering metrics: %w", err)
	}
	pol, _ := d.(PolicySource)
	return &Server{dec: d, pol: pol, cfg: cfg.withDefaults(), m: m}, nil
}

// Register adds the server to a gRPC server.
func (s *Server) Register(g *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(g, s) }

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no descriptors")
	}
	if len(descs) > s.cfg.MaxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors, more than %d", len(descs), s.cfg.MaxDescriptors)
	}
	// Read every descriptor before deciding any: a bad one spends nothing.
	sets := make([][]policy.Descriptor, len(descs))
	hits := make([]int64, len(descs))
	for i, d := range descs {
		var err error
		if hits[i], err = s.hits(req, d); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptors[%d]: %v", i, err)
		}
		ds := make([]policy.Descriptor, 0, len(d.GetEntries())+3)
		if sets[i], err = s.descriptors(ds, req.GetDomain(), d); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptors[%d]: %v", i, err)
		}
		if d.GetLimit() != nil {
			var honoured bool
			sets[i], honoured = s.withOverride(sets[i], d)
			s.m.overrides.WithLabelValues(map[bool]string{true: "honoured", false: "ignored"}[honoured]).Inc()
		}
	}
	gone := s.replaced(sets)
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs)),
	}
	decs := make([]agent.Decision, len(descs))
	for i := range descs {
		if gone != nil && gone[i] {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
			s.m.replaced.Inc()
			continue
		}
		dec := s.dec.Allow(ctx, sets[i], hits[i])
		if dec.Path == agent.PathFailedClosed {
			return nil, status.Errorf(codes.Unavailable, "rule %q: region unreachable and the rule fails closed", dec.Rule)
		}
		if dec.Path == agent.PathShadow {
			s.m.shadow.Inc()
		}
		if !dec.Allowed {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses[i] = descriptorStatus(dec)
		decs[i] = dec
	}
	if !s.cfg.OmitHeaders {
		resp.ResponseHeadersToAdd = headers(decs)
	}
	return resp, nil
}

func (s *Server) hits(req *rlsv3.RateLimitRequest, d *ratelimitv3.RateLimitDescriptor) (int64, error) {
	hits := int64(req.GetHitsAddend())
	if h := d.GetHitsAddend(); h != nil {
		if h.GetValue() > uint64(s.cfg.MaxHits) {
			return 0, fmt.Errorf("hits_addend %d, more than %d", h.GetValue(), s.cfg.MaxHits)
		}
		hits = int64(h.GetValue())
	}
	if d.GetIsNegativeHits() {
		return 0, errors.New("negative hits are not supported: ration debits tokens only when all rules pass, so nothing needs refunding")
	}
	if hits == 0 {
		hits = 1 // Envoy's default: an unset hits_addend means one hit
	}
	if hits > s.cfg.MaxHits {
		return 0, fmt.Errorf("hits_addend %d, more than %d", hits, s.cfg.MaxHits)
	}
	return hits, nil
}

func (s *Server) descriptors(ds []policy.Descriptor, domain string, d *ratelimitv3.RateLimitDescriptor) ([]policy.Descriptor, error) {
	if n := len(d.GetEntries()); n > s.cfg.MaxEntries {
		return nil, fmt.Errorf("%d entries, more than %d", n, s.cfg.MaxEntries)
	}
	ds, err := envoydesc.Append(ds, s.cfg.DomainKey, domain, d.GetEntries())
	if err != nil {
		return nil, err
	}
	if s.cfg.KeysKey != "-" {
		ds = append(ds, keysDescriptor(s.cfg.KeysKey, d.GetEntries()))
	}
	return ds, nil
}

// descriptorStatus describes one decision in Envoy's terms.
func descriptorStatus(dec agent.Decision) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	if !dec.Allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if dec.Rule == "" {
		return st // no rule matched: no limit to describe
	}
	if dec.Window.Fixed() {
		st.CurrentLimit = windowLimit(dec.Rule, dec.Limit, dec.Window)
	} else {
		st.CurrentLimit = currentLimit(dec.Rule, dec.Limit, dec.Period)
	}
	st.LimitRemaining = uint32(min(max(dec.Remaining, 0), math.MaxUint32))
	reset := dec.Reset
	if !dec.Allowed && dec.RetryAfter > reset {
		reset = dec.RetryAfter
	}
	st.DurationUntilReset = durationpb.New(reset)
	return st
}

var units = []struct {
	d    time.Duration
	unit rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
}

// calendarUnits are the Envoy units of calendar windows.
var calendarUnits = map[policy.Calendar]rlsv3.RateLimitResponse_RateLimit_Unit{
	policy.CalendarDay:   rlsv3.RateLimitResponse_RateLimit_DAY,
	policy.CalendarWeek:  rlsv3.RateLimitResponse_RateLimit_WEEK,
	policy.CalendarMonth: rlsv3.RateLimitResponse_RateLimit_MONTH,
}

// windowLimit expresses a fixed window's limit in Envoy's units: a calendar
// window's own (DAY, WEEK, MONTH, whatever the current window's real
// length), and for windows of a length that divides a day, the largest
// unit that divides it, with a multiplier (a 5m window is 5 MINUTE). The
// nominal length counts, not the current window's, which a DST change can
// shorten.
func windowLimit(name string, limit int64, w agent.Window) *rlsv3.RateLimitResponse_RateLimit {
	if u, ok := calendarUnits[w.Calendar]; ok {
		return &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: uint32(min(limit, math.MaxUint32)), Unit: u}
	}
	return currentLimit(name, limit, w.Length)
}

// currentLimit expresses limit per period in Envoy's units: the largest
// unit that divides the period, with a multiplier; a period of less than a
// whole unit becomes the same rate in the smallest unit that holds a request.
func currentLimit(name string, limit int64, period time.Duration) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: uint32(min(limit, math.MaxUint32))}
	for _, u := range units {
		if period >= u.d && period%u.d == 0 {
			rl.Unit = u.unit
			if m := period / u.d; m != 1 {
				rl.UnitMultiplier = wrapperspb.UInt32(uint32(min(int64(m), math.MaxUint32)))
			}
			return rl
		}
	}
	// The same rate in the smallest unit that holds at least one request.
	for i := len(units) - 1; i >= 0; i-- {
		perUnit := float64(limit) * float64(units[i].d) / float64(period)
		if perUnit >= 1 || i == 0 {
			rl.Unit = units[i].unit
			rl.RequestsPerUnit = uint32(min(perUnit, math.MaxUint32))
			break
		}
	}
	return rl
}
