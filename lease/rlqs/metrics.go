package rlqs

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's Prometheus metrics.
type metrics struct {
	streams  prometheus.Gauge
	buckets  prometheus.Gauge
	reports  prometheus.Counter
	invalid  *prometheus.CounterVec // bucket usages ignored, by reason
	actions  *prometheus.CounterVec // bucket actions sent, by kind
	debited  prometheus.Counter     // store tokens pre-debited
	returned prometheus.Counter     // store tokens credited back
	failures *prometheus.CounterVec // lease path failures, by gRPC code
}

// newMetrics registers the metrics on reg; nil registers none.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_rlqs_streams", Help: "Open RLQS streams (Envoy proxies).",
		}),
		buckets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_rlqs_buckets", Help: "Quota buckets held across RLQS streams.",
		}),
		reports: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_rlqs_reports_total", Help: "RLQS usage reports received.",
		}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_rlqs_invalid_usages_total",
			Help: "Bucket usages ignored, by reason (empty_bucket_id, too_many_entries, bad_entry, bad_time_elapsed, count_out_of_range, too_many_buckets, fixed_window_rule, key_too_long).",
		}, []string{"reason"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_rlqs_actions_total",
			Help: "Bucket actions sent, by kind (token_bucket, keep_alive, deny_all, allow_all, abandon, expire).",
		}, []string{"kind"}),
		debited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_rlqs_tokens_debited_total", Help: "Store tokens pre-debited for RLQS assignments.",
		}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_rlqs_tokens_returned_total", Help: "Store tokens debited for RLQS and credited back unused.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_rlqs_lease_failures_total", Help: "Lease calls for RLQS buckets that failed, by gRPC code.",
		}, []string{"code"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.streams, m.buckets, m.reports, m.invalid, m.actions, m.debited, m.returned, m.failures} {
		if err := reg.Register(c); err != nil {
			return nil, errors.Join(errors.New("rlqs: registering metrics"), err)
		}
	}
	return m, nil
}
