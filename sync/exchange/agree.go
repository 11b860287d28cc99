package exchange

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/region"
)

// This file reports the rules that regions disagree on (region's
// Disagreements): a log line per change, a gauge per rule, and
// Config.OnDisagree, through which regiond enforces the stricter
// definition.

// noteDisagreements runs after every epoch's phase.
func (x *Exchanger) noteDisagreements() {
	if x.node.DisagreementGen() == x.disagreeGen {
		return
	}
	ds, gen := x.node.Disagreements()
	x.disagreeGen = gen
	now := make(map[string]bool, len(ds))
	for _, d := range ds {
		now[d.Rule] = true
		for _, t := range d.Theirs {
			x.cfg.Logger.Warn("exchange: regions disagree on a global rule; its keys keep their shares and the stricter definition is enforced until they agree",
				"rule", d.Rule, "policy", d.Policy, "limit", d.Ours.Limit, "period", d.Ours.Period, "burst", d.Ours.Burst, "cost", d.Ours.Cost,
				"peer_region", t.Region, "peer_replica", t.Replica, "peer_policy", t.Policy,
				"peer_limit", t.Def.Limit, "peer_period", t.Def.Period, "peer_burst", t.Def.Burst, "peer_cost", t.Def.Cost)
		}
	}
	for rule := range x.disagreeing {
		if !now[rule] {
			x.cfg.Logger.Info("exchange: regions agree on the rule again; its keys exchange again", "rule", rule)
			x.met.disagree.DeleteLabelValues(rule)
		}
	}
	for rule := range now {
		if !x.disagreeing[rule] {
			x.met.disagreements.Inc()
		}
		x.met.disagree.WithLabelValues(rule).Set(1)
	}
	x.disagreeing = now
	if x.cfg.OnDisagree != nil {
		x.cfg.OnDisagree(ds)
	}
}

func disagreeMetrics() (*prometheus.GaugeVec, prometheus.Counter) {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ration_exchange_rule_disagreement",
			Help: "1 for a global rule that another region (or replica) heard defines otherwise: its keys are held (no gifts, no reclaim) and the stricter definition is enforced until they agree.",
		}, []string{"rule"}),
		prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_exchange_rule_disagreements_total",
			Help: "Times a global rule started to be held for a disagreement between regions' policies.",
		})
}

// policyName is what reports carry as Report.Policy.
func (x *Exchanger) policyName() string {
	if x.cfg.PolicyName != nil {
		if n := x.cfg.PolicyName(); n != "" {
			return n
		}
	}
	return x.pol.Version()
}

// rules is region.Config.Rules: the policy the latest epoch took.
func (x *Exchanger) rules() (string, []region.RuleDef) {
	if x.pol == nil {
		return "", nil
	}
	return x.policyName(), x.pol.Defs()
}
