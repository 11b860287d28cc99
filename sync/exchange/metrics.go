package exchange

import (
	"cmp"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
)

type metrics struct {
	share          *prometheus.GaugeVec
	moved          *prometheus.CounterVec
	reportAge      *prometheus.GaugeVec
	dropped        *prometheus.CounterVec
	epochs         *prometheus.CounterVec
	leader         prometheus.Gauge
	epochSeconds   prometheus.Histogram
	received       prometheus.Counter
	published      prometheus.Counter
	publishedBytes prometheus.Counter
	wireVersion    prometheus.Gauge
	publishErrors  prometheus.Counter
	storeErrors    *prometheus.CounterVec
	shareWrites    *prometheus.CounterVec // keys written to the store, by op
	deferred       prometheus.Counter
	stateBytes     prometheus.Gauge
	stateWritten   prometheus.Counter
	resyncs        prometheus.Counter
	tokensReleased prometheus.Counter
	keys           *prometheus.GaugeVec
	visits         *prometheus.CounterVec // keys the epochs visited, by what woke them
	keptAwake      *prometheus.CounterVec // of those, kept awake, by reason
	disagree       *prometheus.GaugeVec
	disagreements  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		share: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ration_exchange_share_ppm",
			Help: "Applied share in ppm of the most active global keys, per region (this region's from its state, peers' from their latest reports); only on the replica running the exchange.",
		}, []string{"key", "region"}),
		moved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_exchange_transfers_ppm_total",
			Help: "Share this region's store lowered (given) or raised (received) by the exchange, in ppm summed over keys.",
		}, []string{"direction"}),
		reportAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ration_exchange_report_age_seconds",
			Help: "Seconds since the latest complete report from each region was received, at the latest epoch.",
		}, []string{"region"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_exchange_dropped_total",
			Help: "Received messages, parts or reports dropped, by reason.",
		}, []string{"reason"}),
		epochs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_exchange_epochs_total",
			Help: "Sync epochs run, as the replica running the region's exchange (holder) or not (follower).",
		}, []string{"role"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_exchange_leader",
			Help: "1 while this replica holds its region's election and runs the exchange.",
		}),
		epochSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ration_exchange_epoch_duration_seconds",
			Help:    "Time one epoch took: store writes, persisting the state, encoding and publishing.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 8),
		}),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_exchange_messages_received_total",
			Help: "NATS messages received on the sync subjects.",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_exchange_messages_published_total",
			Help: "NATS messages (report parts) published.",
		}),
		publishedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_exchange_published_bytes_total",
			Help: "Bytes of report parts published.",
		}),
		wireVersion: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_exchange_wire_version",
			Help: "The newest wire version reports may be written in: the newest every peer region's replicas read (each report takes the smallest up to it).",
		}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_exchange_publish_errors_total",
			Help: "Reports that could not be encoded or published.",
		}),
		shareWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_exchange_share_writes_total",
			Help: "Keys whose share the exchange wrote to the store (set) or removed when they retired (delete): store operations, one per key.",
		}, []string{"op"}),
		deferred: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_exchange_share_writes_deferred_total",
			Help: "Share writes left for a later epoch: past the epoch's budget for writes, or after a failed store call. Their keys give nothing until written.",
		}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_exchange_store_errors_total",
			Help: "Failed store calls of the exchange, by operation.",
		}, []string{"op"}),
		stateBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_exchange_state_bytes",
			Help: "Size of the region's exchange state at its latest whole save (at a take-over; later epochs write the keys that changed).",
		}),
		stateWritten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_exchange_state_written_bytes_total",
			Help: "Bytes of exchange state written to the store: whole at a take-over, the records of the keys that changed at other epochs.",
		}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_exchange_store_resyncs_total",
			Help: "Times the store's incarnation changed (it may have lost writes) and every share was written again.",
		}),
		tokensReleased: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_exchange_tokens_released_total",
			Help: "Tokens this region's store took out of buckets whose share was lowered, to give with the share.",
		}),
		keys: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ration_exchange_keys",
			Help: "Global keys the exchange holds (held) and, of those, the keys the latest epoch skipped at rest (resting); only on the replica running the exchange.",
		}, []string{"state"}),
		visits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_exchange_key_visits_total",
			Help: "Keys the epochs visited (an epoch's cost follows them), by what woke them: all (every key: something all keys read changed, or keys could not rest), timer (the key's own) or touched (its tally, a peer's listing, a store write, or awake since its last epoch); only on the replica running the exchange.",
		}, []string{"woken_by"}),
		keptAwake: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_exchange_keys_kept_awake_total",
			Help: "Keys an epoch visited and kept awake for the next, by the first reason found: no-rest, moved (planned a step), changed, unapplied (stored share unknown), exits, to-apply, unsettled (gifts not acknowledged), unknown (a peer's state), reclaim, unsteady (smoothed demand could still give); only on the replica running the exchange.",
		}, []string{"reason"}),
	}
	for _, w := range []string{"all", "timer", "touched"} {
		m.visits.WithLabelValues(w)
	}
	for _, r := range region.AwakeReasons[1:] {
		m.keptAwake.WithLabelValues(r)
	}
	m.disagree, m.disagreements = disagreeMetrics()
	for _, r := range codec.Reasons {
		m.dropped.WithLabelValues(string(r))
	}
	for _, d := range []string{"given", "received"} {
		m.moved.WithLabelValues(d)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.share, m.moved, m.reportAge, m.dropped, m.epochs, m.leader,
		m.epochSeconds, m.received, m.published, m.publishedBytes, m.wireVersion, m.publishErrors, m.storeErrors, m.shareWrites, m.deferred, m.stateBytes, m.stateWritten, m.resyncs, m.tokensReleased, m.keys, m.visits, m.keptAwake, m.disagree, m.disagreements} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// topKeys picks the most active keys for the share gauge: the keys with the
// most demand in the latest reports of every region, at most n.
type topKeys struct {
	own    []topEntry
	peers  map[string][]topEntry       // region → its top keys
	shares map[string]map[string]int64 // region → published key → share
	shown  map[string]struct{}         // keys with a gauge now
}

type topEntry struct {
	key    string
	demand int64
	share  int64
}

// best returns the n keys of r with the most demand.
func best(r *region.Report, n int) []topEntry {
	var top []topEntry
	for i := range r.Keys {
		k := &r.Keys[i]
		if k.Demand <= 0 || (len(top) == n && k.Demand <= top[n-1].demand) {
			continue
		}
		e := topEntry{k.Key, k.Demand, k.SharePPM}
		j, _ := slices.BinarySearchFunc(top, e, func(a, b topEntry) int { return cmp.Compare(b.demand, a.demand) })
		top = slices.Insert(top, j, e)
		if len(top) > n {
			top = top[:n]
		}
	}
	return top
}

func (t *topKeys) ownReport(r *region.Report, n int) {
	if n > 0 {
		t.own = best(r, n)
	}
}

func (t *topKeys) peerReport(r *region.Report, n int) {
	if n <= 0 || !r.Exchange {
		return
	}
	if t.peers == nil {
		t.peers, t.shares = make(map[string][]topEntry), make(map[string]map[string]int64)
	}
	top, sh := best(r, n), make(map[string]int64, len(t.shown))
	if r.Refresh != 0 {
		// A delta leaves out what did not change: a key it does not list
		// keeps its last figures.
		listed := make(map[string]bool, len(t.peers[r.Region])+len(t.shown))
		for _, e := range t.peers[r.Region] {
			listed[e.key] = false
		}
		for k := range t.shares[r.Region] {
			listed[k] = false
		}
		for i := range r.Keys {
			if _, ok := listed[r.Keys[i].Key]; ok {
				listed[r.Keys[i].Key] = true
			}
		}
		for _, e := range t.peers[r.Region] {
			if !listed[e.key] && !slices.ContainsFunc(top, func(x topEntry) bool { return x.key == e.key }) {
				top = append(top, e)
			}
		}
		slices.SortFunc(top, func(a, b topEntry) int { return cmp.Compare(b.demand, a.demand) })
		top = top[:min(n, len(top))]
		for k, v := range t.shares[r.Region] {
			if !listed[k] {
				sh[k] = v
			}
		}
	}
	t.peers[r.Region] = top
	if len(t.shown) > 0 {
		for i := range r.Keys {
			if _, ok := t.shown[r.Keys[i].Key]; ok {
				sh[r.Keys[i].Key] = r.Keys[i].SharePPM
			}
		}
	}
	t.shares[r.Region] = sh
}

// updateTopKeys resets the share gauge to the current most active keys.
func (x *Exchanger) updateTopKeys() {
	t := &x.top
	x.met.share.Reset()
	n := x.cfg.TopKeys
	if n <= 0 || !x.node.Holding() {
		t.shown = nil
		return
	}
	demand := make(map[string]int64)
	for _, e := range t.own {
		demand[e.key] += e.demand
	}
	for _, es := range t.peers {
		for _, e := range es {
			demand[e.key] += e.demand
		}
	}
	keys := make([]string, 0, len(demand))
	for k := range demand {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(demand[b], demand[a]), cmp.Compare(a, b))
	})
	keys = keys[:min(n, len(keys))]
	t.shown = make(map[string]struct{}, len(keys))
	for _, k := range keys {
		t.shown[k] = struct{}{}
		x.met.share.WithLabelValues(k, x.cfg.Region).Set(float64(x.node.Share(k)))
		for r, es := range t.peers {
			if v, ok := t.shares[r][k]; ok {
				x.met.share.WithLabelValues(k, r).Set(float64(v))
				continue
			}
			for _, e := range es {
				if e.key == k {
					x.met.share.WithLabelValues(k, r).Set(float64(e.share))
				}
			}
		}
	}
}
