package service

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the service's Prometheus metrics. The labelled series a call
// touches are looked up once, here, not per call: the simulator runs every
// agent's calls through the service.
type metrics struct {
	requests       *prometheus.CounterVec   // by rpc and outcome
	items          *prometheus.CounterVec   // lease items by outcome
	tokensGranted  prometheus.Counter       // tokens pre-debited into leases
	tokensReturned prometheus.Counter       // tokens credited back
	staleReturns   prometheus.Counter       // tokens returned too early in a fixed window, dropped
	storeLatency   *prometheus.HistogramVec // store call latency by op
	storeErrors    *prometheus.CounterVec   // store call failures by op
	storeItems     *prometheus.CounterVec   // items sent to the store by op
	refused        *prometheus.CounterVec   // calls refused by a rule's clients

	grantItems, returnItems prometheus.Counter
	dryAnswers              prometheus.Counter     // lease items answered from the memory of dry keys
	dryProbes               prometheus.Counter     // grant items that probe a dry key once its memory expired
	dryDropped              prometheus.Counter     // dry-key notices a subscriber fell too far behind for
	stagedDenied            *prometheus.CounterVec // tokens staged rules would have denied, by rule
	rules                   *ruleMetrics           // denied tokens and lease sizes by rule (rulemetrics.go)

	lease, ret  rpcMetrics
	granted     prometheus.Counter // items by outcome
	partial     prometheus.Counter
	denied      prometheus.Counter
	invalidItem prometheus.Counter
}

// rpcMetrics are one rpc's series.
type rpcMetrics struct {
	ok, invalid, storeError prometheus.Counter
	latency                 prometheus.Observer
	storeErrors             prometheus.Counter
}

// newMetrics registers the service's metrics on reg; a nil reg keeps them
// unregistered, so the service works the same without metrics.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_lease_requests_total",
			Help: "Lease API calls by rpc (lease, return) and outcome (ok, invalid, store_error).",
		}, []string{"rpc", "outcome"}),
		items: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_lease_items_total",
			Help: "Lease items by outcome (granted, partial, denied, invalid), and those of them denied from the memory of dry keys without the store (dry).",
		}, []string{"outcome"}),
		tokensGranted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_tokens_granted_total",
			Help: "Tokens pre-debited from regional buckets into leases.",
		}),
		tokensReturned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_tokens_returned_total",
			Help: "Unused lease tokens credited back to regional buckets.",
		}),
		staleReturns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_tokens_return_dropped_total",
			Help: "Tokens returned for a fixed-window rule within a lease TTL of the window's start, dropped: they may be the window before's.",
		}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ration_store_call_duration_seconds",
			Help:    "Latency of allocator store calls by op (grant, return).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}, []string{"op"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_lease_refused_total",
			Help: "Lease and return calls refused because their caller is not among a rule's clients, by rpc, rule and client identity (at most 64 identities; then other; none without a certificate).",
		}, []string{"rpc", "rule", "client"}),
		stagedDenied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_policy_staged_denied_tokens_total",
			Help: "Tokens that the rules of a staged revision (ration policy push --shadow) would have denied, as agents report their demand, by staged rule.",
		}, []string{"rule"}),
		dryDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_lease_dry_notices_dropped_total",
			Help: "Dry-key notices not sent to an agent's WatchDry stream because it fell behind (each costs that agent an ask at most).",
		}),
		storeItems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_store_items_total",
			Help: "Items sent to the allocator store by op (grant, return, and probe: the grants among them that probe a key remembered dry once the memory is no longer trusted): its operations, one per key.",
		}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_store_errors_total",
			Help: "Allocator store calls that failed, by op.",
		}, []string{"op"}),
	}
	m.rules = newRuleMetrics()
	m.lease = m.rpc("lease", "grant")
	m.ret = m.rpc("return", "return")
	m.granted = m.items.WithLabelValues("granted")
	m.partial = m.items.WithLabelValues("partial")
	m.denied = m.items.WithLabelValues("denied")
	m.invalidItem = m.items.WithLabelValues("invalid")
	m.dryAnswers = m.items.WithLabelValues("dry")
	m.grantItems = m.storeItems.WithLabelValues("grant")
	m.returnItems = m.storeItems.WithLabelValues("return")
	m.dryProbes = m.storeItems.WithLabelValues("probe")
	if reg == nil {
		return m, nil
	}
	for _, c := range append([]prometheus.Collector{m.requests, m.items, m.tokensGranted, m.tokensReturned, m.staleReturns, m.storeLatency, m.storeErrors, m.storeItems, m.refused, m.dryDropped, m.stagedDenied}, m.rules.collectors()...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) rpc(name, op string) rpcMetrics {
	return rpcMetrics{
		ok:          m.requests.WithLabelValues(name, "ok"),
		invalid:     m.requests.WithLabelValues(name, "invalid"),
		storeError:  m.requests.WithLabelValues(name, "store_error"),
		latency:     m.storeLatency.WithLabelValues(op),
		storeErrors: m.storeErrors.WithLabelValues(op),
	}
}
