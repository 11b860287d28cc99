package regiond

import (
	"log/slog"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
)

// enforcer is what the daemon enforces: the policy its source loaded (the
// base, named for reports by its revision in the policy store or its
// version), with each global rule that another region defines otherwise
// replaced by the stricter definition while their keys are held
// (docs/DESIGN.md, "Regions agree before they exchange").
type enforcer struct {
	svc *service.Service
	log *slog.Logger
	met *policyMetrics

	mu       sync.Mutex
	base     *policy.Set
	name     string
	ds       []region.Disagreement
	stricter []string // rules enforced stricter than base
}

// policyMetrics are the policy's gauges and counters.
type policyMetrics struct {
	revision prometheus.Gauge
	refused  *prometheus.CounterVec
	stricter prometheus.Gauge
}

func newPolicyMetrics(reg prometheus.Registerer) (*policyMetrics, error) {
	m := &policyMetrics{
		revision: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_policy_revision",
			Help: "Revision of the policy store (-policy nats-kv://) that this regiond applied; 0 with a policy file or the embedded policy.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_policy_refused_total",
			Help: "Policy revisions (or file contents) refused because they failed validation; the running policy stayed.",
		}, []string{"source"}),
		stricter: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_policy_stricter_rules",
			Help: "Global rules enforced with another region's stricter definition while the regions disagree on them.",
		}),
	}
	for _, c := range []prometheus.Collector{m.revision, m.refused, m.stricter} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// setBase makes set the loaded policy; name is what reports call it.
func (e *enforcer) setBase(set *policy.Set, name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.base, e.name = set, name
	e.applyLocked()
}

// disagree is exchange.Config.OnDisagree.
func (e *enforcer) disagree(ds []region.Disagreement) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ds = ds
	e.applyLocked()
}

func (e *enforcer) applyLocked() {
	set, changed, err := e.base.Agreed(e.ds)
	if err != nil {
		// Not reached for a valid base: Stricter keeps rules valid. The
		// disagreeing keys are held all the same.
		e.log.Error("policy: cannot derive the stricter policy; enforcing the loaded one", "err", err)
		set, changed = e.base, nil
	}
	if !slices.Equal(changed, e.stricter) {
		if len(changed) > 0 {
			e.log.Warn("policy: enforcing the stricter definition of rules other regions define otherwise", "rules", changed, "policy", e.name)
		} else if len(e.stricter) > 0 {
			e.log.Info("policy: regions agree; enforcing the loaded policy", "policy", e.name)
		}
		e.stricter = changed
	}
	e.met.stricter.Set(float64(len(changed)))
	e.svc.SetPolicy(set)
}

// Base is the loaded policy: what the exchange reports and compares.
func (e *enforcer) Base() *policy.Set {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.base
}

// Stricter lists the rules enforced stricter than loaded.
func (e *enforcer) Stricter() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.stricter)
}

// Name is the loaded policy's name for reports.
func (e *enforcer) Name() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.name
}
