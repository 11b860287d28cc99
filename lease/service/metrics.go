package service

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests       *prometheus.CounterVec   // by rpc and outcome
	items          *prometheus.CounterVec   // lease items by outcome
	tokensGranted  prometheus.Counter       // tokens pre-debited into leases
	tokensReturned prometheus.Counter       // tokens credited back
	storeLatency   *prometheus.HistogramVec // store call latency by op
	storeErrors    *prometheus.CounterVec   // store call failures by op
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
			Help: "Lease items by outcome (granted, partial, denied, invalid).",
		}, []string{"outcome"}),
		tokensGranted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_tokens_granted_total",
			Help: "Tokens pre-debited from regional buckets into leases.",
		}),
		tokensReturned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_tokens_returned_total",
			Help: "Unused lease tokens credited back to regional buckets.",
		}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ration_store_call_duration_seconds",
			Help:    "Latency of allocator store calls by op (grant, return).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_store_errors_total",
			Help: "Allocator store calls that failed, by op.",
		}, []string{"op"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.items, m.tokensGranted, m.tokensReturned, m.storeLatency, m.storeErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
