package envoyrls

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/lease/agent/httplimit"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/policy/envoyimport"
)

// PolicySource gives the policy the Decider decides by; *agent.Agent is
// one. A Decider that is one lets the Server honour descriptor limit
// overrides and replaces across an Envoy request's descriptors.
type PolicySource interface {
	Policy() *policy.Set
}

// limitPeriods are the periods of Envoy's units; YEAR has no ration rule.
var limitPeriods = map[typev3.RateLimitUnit]time.Duration{
	typev3.RateLimitUnit_SECOND: time.Second,
	typev3.RateLimitUnit_MINUTE: time.Minute,
	typev3.RateLimitUnit_HOUR:   time.Hour,
	typev3.RateLimitUnit_DAY:    policy.NominalDay,
	typev3.RateLimitUnit_MONTH:  policy.NominalMonth,
}

// LimitValue spells a descriptor limit override as the value of the
// LimitKey descriptor, "100/minute", or with a unit_multiplier other than
// 1, "100/5minute", and returns the period it stands for. ok is false for
// a unit no ration rule has (YEAR, UNKNOWN).
func LimitValue(l *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (v string, period time.Duration, ok bool) {
	period, ok = limitPeriods[l.GetUnit()]
	if !ok {
		return "", 0, false
	}
	unit := strings.ToLower(l.GetUnit().String())
	if m := l.GetUnitMultiplier(); m != nil && m.GetValue() != 1 {
		if m.GetValue() == 0 {
			return "", 0, false
		}
		period *= time.Duration(m.GetValue())
		unit = strconv.FormatUint(uint64(m.GetValue()), 10) + unit
	}
	return strconv.FormatUint(uint64(l.GetRequestsPerUnit()), 10) + "/" + unit, period, true
}

// withOverride returns ds with the LimitKey descriptor of d's limit
// override when the policy allows it: some rule applying to the request
// with the override has allow_descriptor_limit, matches the override's
// value, and has the override's limit and period. Otherwise ds unchanged
// and honoured false: the request is decided by its other rules.
func (s *Server) withOverride(ds []policy.Descriptor, d *ratelimitv3.RateLimitDescriptor) (_ []policy.Descriptor, honoured bool) {
	l := d.GetLimit()
	if s.pol == nil || s.cfg.LimitKey == "-" {
		return ds, false
	}
	v, period, ok := LimitValue(l)
	if !ok {
		return ds, false
	}
	with := append(ds, policy.Descriptor{Key: s.cfg.LimitKey, Value: v})
	for _, r := range s.pol.Policy().Match(nil, with) {
		if r.AllowDescriptorLimit && r.Limit == int64(l.GetRequestsPerUnit()) && r.Period == period &&
			slices.Contains(r.Match, policy.Descriptor{Key: s.cfg.LimitKey, Value: v}) {
			return with, true
		}
	}
	return ds, false
}

// replaced reports, for each descriptor set of a request, whether every
// rule that applies to it is replaced by a rule applying to another (or
// the same) descriptor of the request, as Envoy's service drops a limit
// that another descriptor's limit replaces. A set that some unreplaced rule
// applies to is decided as usual, replaced rules included: Allow decides a
// set's rules together.
func (s *Server) replaced(sets [][]policy.Descriptor) []bool {
	if s.pol == nil || len(sets) < 2 {
		return nil
	}
	set := s.pol.Policy()
	if !set.HasReplaces() {
		return nil
	}
	matched := make([][]*policy.Rule, len(sets))
	gone := map[string]bool{}
	for i, ds := range sets {
		matched[i] = set.Match(nil, ds)
		for _, r := range matched[i] {
			for _, n := range r.Replaces {
				gone[n] = true
			}
		}
	}
	out := make([]bool, len(sets))
	for i, rs := range matched {
		out[i] = len(rs) > 0 && !slices.ContainsFunc(rs, func(r *policy.Rule) bool { return !gone[r.Name] })
	}
	return out
}

// headers describes the request's tightest decision for Envoy to add to
// its response: the first denied descriptor's, else the one with the least
// remaining relative to its limit. Shadow decisions and decisions without a
// rule describe nothing. The fields are httplimit's (RateLimit-Policy,
// RateLimit, X-RateLimit-*, Retry-After when denied).
func headers(decs []agent.Decision) []*corev3.HeaderValue {
	best := -1
	for i, d := range decs {
		if d.Rule == "" || d.Path == agent.PathShadow || d.Limit <= 0 {
			continue
		}
		if !d.Allowed {
			best = i
			break
		}
		if best < 0 || float64(d.Remaining)/float64(d.Limit) < float64(decs[best].Remaining)/float64(decs[best].Limit) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	h := http.Header{}
	httplimit.SetHeaders(h, decs[best])
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	out := make([]*corev3.HeaderValue, 0, len(names))
	for _, k := range names {
		out = append(out, &corev3.HeaderValue{Key: k, Value: h.Get(k)})
	}
	return out
}

// metrics counts what the adapter decides beyond the agent's decisions.
type metrics struct {
	overrides *prometheus.CounterVec
	replaced  prometheus.Counter
	shadow    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		overrides: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ration_envoyrls_limit_overrides_total",
			Help: "Descriptors with a limit override, by result: honoured (a rule with allow_descriptor_limit matched it) or ignored (decided by the other rules)."}, []string{"result"}),
		replaced: prometheus.NewCounter(prometheus.CounterOpts{Name: "ration_envoyrls_replaced_descriptors_total",
			Help: "Descriptors admitted without a decision because every rule applying to them was replaced by another descriptor's rule."}),
		shadow: prometheus.NewCounter(prometheus.CounterOpts{Name: "ration_envoyrls_shadow_descriptors_total",
			Help: "Descriptors answered OK that a shadow rule would have denied."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.overrides, m.replaced, m.shadow} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// keysDescriptor is the KeysKey descriptor of an Envoy descriptor.
func keysDescriptor(name string, entries []*ratelimitv3.RateLimitDescriptor_Entry) policy.Descriptor {
	var b []byte
	for i, e := range entries {
		b = envoyimport.AppendKeys(b, i, e.GetKey())
	}
	return policy.Descriptor{Key: name, Value: string(b)}
}
