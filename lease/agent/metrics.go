package agent

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics exports the agent's counters to Prometheus. The counters live in
// the agent's core (striped, atomic) and are read at scrape time, so the request
// path never touches a Prometheus object except, for one decision in 64, the
// latency histogram.
type metrics struct {
	reg     prometheus.Registerer
	stats   func() Stats
	latency prometheus.Histogram // nil without a registry
	// leaseTokens is the tokens of each grant by rule, observed as a grant
	// arrives (off the request path); nil without a registry.
	leaseTokens *prometheus.HistogramVec

	decisions, syncDecisions, calls, callErrors, items, tokens, fallbacks, breaker, keys, agents, policies *prometheus.Desc
}

// decisionsHelp is ration_agent_decisions_total's help. Its series exist
// once non-zero: fourteen per rule, most of them zero, would be many
// series for a large policy.
const decisionsHelp = "Decisions by the rule that decided them (" + RuleNone + ": none did; " + RuleOther + ": rules beyond the first 1024 names), the path that made them and their outcome."

func newMetrics(reg prometheus.Registerer, stats func() Stats) (*metrics, error) {
	m := &metrics{reg: reg, stats: stats}
	if reg == nil {
		return m, nil
	}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("ration_agent_"+name, help, labels, nil)
	}
	m.decisions = d("decisions_total", decisionsHelp, "rule", "path", "outcome")
	m.syncDecisions = d("sync_decisions_total", "Decisions that waited for a round trip to the region.")
	m.calls = d("round_trips_total", "Calls to the region's lease API by method (a Lease call may carry many keys).", "method")
	m.callErrors = d("round_trip_errors_total", "Calls to the region's lease API that failed.")
	m.items = d("lease_items_total", "Keys carried by Lease calls (one per lease asked for).")
	m.tokens = d("tokens_total", "Leased tokens: granted by the region, dropped unspent at lease expiry (or lost), returned.", "event")
	m.fallbacks = d("fallback_activations_total", "Keys that switched to their emergency local bucket because the region was unreachable.")
	m.breaker = d("region_unreachable", "1 while the circuit breaker to the region is open.")
	m.keys = d("keys", "Keys held in memory.")
	m.agents = d("region_agents", "Agents in the region, as the region last reported.")
	m.policies = d("policy_updates_total", "Policies from the region, applied or refused.", "result")
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ration_agent_decision_seconds",
		Help:    "Time to decide a request (sampled: one decision in 64 per stripe).",
		Buckets: []float64{50e-9, 100e-9, 250e-9, 500e-9, 1e-6, 5e-6, 25e-6, 100e-6, 500e-6, 1e-3, 5e-3, 25e-3},
	})
	m.leaseTokens = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ration_agent_lease_tokens",
		Help:    "Tokens of each lease granted to a key, by rule (" + RuleOther + ": rules beyond the first 1024 names); grants of none are not observed.",
		Buckets: prometheus.ExponentialBuckets(1, 4, 12), // 1 to 4^11 (about 4M)
	}, []string{"rule"})
	var done []prometheus.Collector
	for _, c := range []prometheus.Collector{m, m.latency, m.leaseTokens} {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return nil, fmt.Errorf("agent: registering metrics: %w", err)
		}
		done = append(done, c)
	}
	return m, nil
}

// observeGrant records a grant of n tokens on a key of rule; a no-op
// without a registry.
func (m *metrics) observeGrant(rule string, n int64) {
	if m.leaseTokens != nil && n > 0 {
		m.leaseTokens.WithLabelValues(rule).Observe(float64(n))
	}
}

func (m *metrics) unregister() {
	if m.reg != nil {
		m.reg.Unregister(m)
		m.reg.Unregister(m.latency)
		m.reg.Unregister(m.leaseTokens)
	}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.decisions, m.syncDecisions, m.calls, m.callErrors, m.items, m.tokens, m.fallbacks, m.breaker, m.keys, m.agents, m.policies} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	s := m.stats()
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	for rule, d := range s.DecisionsByRule {
		for p := Path(0); p < numPaths; p++ {
			for o, outcome := range [2]string{"denied", "allowed"} {
				if d[p][o] > 0 {
					counter(m.decisions, float64(d[p][o]), rule, p.String(), outcome)
				}
			}
		}
	}
	counter(m.syncDecisions, float64(s.SyncDecisions))
	counter(m.calls, float64(s.LeaseCalls), "lease")
	counter(m.calls, float64(s.ReturnCalls), "return")
	counter(m.callErrors, float64(s.CallErrors))
	counter(m.items, float64(s.LeaseItems))
	counter(m.tokens, float64(s.TokensGranted), "granted")
	counter(m.tokens, float64(s.TokensDropped), "dropped")
	counter(m.tokens, float64(s.TokensReturned), "returned")
	counter(m.fallbacks, float64(s.FallbackActivations))
	b := 0.0
	if s.BreakerOpen {
		b = 1
	}
	gauge(m.breaker, b)
	gauge(m.keys, float64(s.Keys))
	gauge(m.agents, float64(s.Agents))
	counter(m.policies, float64(s.PolicyUpdates), "applied")
	counter(m.policies, float64(s.PolicyErrors), "refused")
}
