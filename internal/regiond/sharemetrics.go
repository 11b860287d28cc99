package regiond

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/lease/service"
)

// shareUpdates exports the share keeper's counts: what became of the
// exchange's share updates (service.ShareCounts). Every outcome but kept is
// one store operation.
type shareUpdates struct {
	keeper *service.ShareKeeper
	desc   *prometheus.Desc
}

func newShareUpdates(k *service.ShareKeeper) *shareUpdates {
	return &shareUpdates{keeper: k, desc: prometheus.NewDesc("ration_share_updates_total",
		"The exchange's share updates by outcome: written because the store's share of the key was not known (unknown), because they lowered it (lowered), because raises may not be kept or the key is a fixed window (short); kept for the key's next grant to carry (kept), and carried (carried); kept raises written because raises may no longer be kept (flushed); not written because they set the initial share, with no tokens, that a grant found in force (same); deferred until their key's next grant or return (deferred), and written then (settled) or applied by that grant as a cap on its share (capped). All but kept, carried, same, deferred and capped are store operations.",
		[]string{"outcome"}, nil)}
}

func (s *shareUpdates) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

func (s *shareUpdates) Collect(ch chan<- prometheus.Metric) {
	c := s.keeper.Counts()
	for _, o := range []struct {
		name string
		n    int64
	}{{"unknown", c.Unknown}, {"lowered", c.Lowered}, {"short", c.Short}, {"kept", c.Kept}, {"flushed", c.Flushed}, {"same", c.Same}, {"deferred", c.Deferred}, {"settled", c.Settled}, {"capped", c.Capped}, {"carried", c.Carried}} {
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.CounterValue, float64(o.n), o.name)
	}
}
