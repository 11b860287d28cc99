package service

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// maxRuleLabels bounds the rule label of the metrics by rule: the rules of
// a policy, and "other" beyond it (a policy of more rules, or a long
// history of renamed ones), so that the series stay bounded.
const maxRuleLabels = 1024

// ruleMetrics are the lease metrics labelled by rule (never by key).
type ruleMetrics struct {
	denied  *prometheus.CounterVec   // rule, source
	granted *prometheus.HistogramVec // rule

	series sync.Map // rule name → *ruleSeries; read without a lock
	mu     sync.Mutex
	n      atomic.Int32
}

// ruleSeries are one rule's series, looked up once per rule.
type ruleSeries struct {
	deniedAgent, deniedRegion prometheus.Counter
	granted                   prometheus.Observer
}

func newRuleMetrics() *ruleMetrics {
	return &ruleMetrics{
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_lease_denied_tokens_total",
			Help: "Tokens denied, by rule and source: agent (requests' tokens agents reported denied, demand less admitted) or region (tokens of lease asks the region granted nothing for, from the store or the memory of dry keys; the agent then denies requests and reports them as source agent, so do not add the two).",
		}, []string{"rule", "source"}),
		granted: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ration_lease_granted_tokens",
			Help:    "Tokens per granted lease item, by rule.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 11), // 1 to about a million
		}, []string{"rule"}),
	}
}

func (m *ruleMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.denied, m.granted}
}

// of returns rule's series: "other" once maxRuleLabels rules have theirs.
func (m *ruleMetrics) of(rule string) *ruleSeries {
	if s, ok := m.series.Load(rule); ok {
		return s.(*ruleSeries)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.series.Load(rule); ok {
		return s.(*ruleSeries)
	}
	label := rule
	if m.n.Load() >= maxRuleLabels {
		label = otherRule
	}
	s := &ruleSeries{
		deniedAgent:  m.denied.WithLabelValues(label, "agent"),
		deniedRegion: m.denied.WithLabelValues(label, "region"),
		granted:      m.granted.WithLabelValues(label),
	}
	if label == rule {
		m.n.Add(1)
	}
	// A rule beyond the bound is remembered too (as other): rule names
	// come from the policies loaded, never from callers.
	m.series.Store(rule, s)
	return s
}
