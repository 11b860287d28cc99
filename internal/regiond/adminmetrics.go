package regiond

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/policy"
)

// adminMetrics are the admin listener's metrics: its requests by route and
// status, and the enforced limit of every rule, read from the policy at
// each scrape.
type adminMetrics struct {
	requests *prometheus.CounterVec
}

func newAdminMetrics(reg prometheus.Registerer, d *Daemon) (*adminMetrics, error) {
	m := &adminMetrics{requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ration_admin_requests_total",
		Help: "Requests to regiond's admin listener by route pattern (path) and HTTP status (code).",
	}, []string{"path", "code"})}
	for _, c := range []prometheus.Collector{m.requests, &ruleLimits{d: d, desc: prometheus.NewDesc("ration_policy_rule_limit",
		"The limit the region enforces for each rule in requests per second (limit / period / cost, the unit agents count decisions in; the stricter definition while regions disagree), to plot beside what is admitted; keyed is true when it applies to each key of the rule, scope is global or region.",
		[]string{"rule", "keyed", "scope"}, nil)}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	if d.keeper != nil {
		if err := reg.Register(newShareUpdates(d.keeper)); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// count wraps the admin mux h: each request is counted under the pattern
// that matched (never the raw path, whose store keys are unbounded).
func (m *adminMetrics) count(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		mux.ServeHTTP(sw, r) // sets r.Pattern to the pattern that matched
		pattern := r.Pattern
		if pattern == "" {
			pattern = "unmatched"
		}
		// Patterns are "GET /path"; the label is the path.
		if _, path, ok := strings.Cut(pattern, " "); ok {
			pattern = path
		}
		m.requests.WithLabelValues(pattern, strconv.Itoa(sw.code)).Inc()
	})
}

type statusWriter struct {
	http.ResponseWriter
	code    int
	written bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.written {
		w.code, w.written = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.written = true
	return w.ResponseWriter.Write(b)
}

// Flush lets promhttp and the like stream through the wrapper.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// ruleLimits is ration_policy_rule_limit: one gauge per rule of the
// enforced policy, at most maxRuleSeries of them.
type ruleLimits struct {
	d    *Daemon
	desc *prometheus.Desc
}

// maxRuleSeries bounds the rule label, as the lease metrics bound theirs.
const maxRuleSeries = 1024

func (c *ruleLimits) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *ruleLimits) Collect(ch chan<- prometheus.Metric) {
	pol := c.d.svc.Policy()
	if pol == nil {
		return
	}
	rules := pol.Rules()
	for _, r := range rules[:min(len(rules), maxRuleSeries)] {
		scope := r.Scope
		if scope == "" {
			scope = policy.ScopeGlobal
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, r.Rate()/float64(max(r.Cost, 1)),
			r.Name, strconv.FormatBool(len(r.Key) > 0), string(scope))
	}
}

// peersReady reports whether every other region was heard, or the ready
// grace passed since Start; nil without an exchange.
func (d *Daemon) peersReady() error {
	x := d.obs.x.Load()
	if x == nil {
		if d.cfg.exchanging() && time.Since(d.started) < d.cfg.ReadyGrace {
			return fmt.Errorf("the exchange is not running yet (ready without it in %v)", (d.cfg.ReadyGrace - time.Since(d.started)).Round(time.Millisecond))
		}
		return nil
	}
	var unheard []string
	for r, at := range x.PeersHeard() {
		if at.IsZero() {
			unheard = append(unheard, r)
		}
	}
	if len(unheard) == 0 {
		return nil
	}
	left := d.cfg.ReadyGrace - time.Since(d.started)
	if left <= 0 {
		return nil // a region that is down must not take this one out of service
	}
	slices.Sort(unheard)
	return fmt.Errorf("no report heard yet from %s (ready without them in %v)", strings.Join(unheard, ", "), left.Round(time.Millisecond))
}
