package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/lease/agent"
)

// regionLine is one region's figures for one report interval. Rates are
// per second of the interval; memory is as sampled at its end.
type regionLine struct {
	Kind         string  `json:"kind"` // "region"
	T            float64 `json:"t_s"`
	Region       string  `json:"region"`
	PID          int     `json:"pid"`
	RSS          int64   `json:"rss_bytes"`
	CPU          float64 `json:"cpu_s_per_s"`
	HeapInuse    int64   `json:"heap_inuse_bytes"`
	Epochs       float64 `json:"epochs"`
	EpochMS      float64 `json:"epoch_ms_mean"`
	LeaseItems   float64 `json:"lease_items_per_s"`
	LeaseErrors  float64 `json:"lease_store_errors"`
	XchgErrors   float64 `json:"exchange_store_errors"`
	SaveErrors   float64 `json:"exchange_save_errors"`
	StateWritten float64 `json:"exchange_state_written_bytes_per_s"`
	ShareWrites  float64 `json:"exchange_share_writes_per_s"`
	ShareDefer   float64 `json:"exchange_share_writes_deferred_per_s"`
	RedisUsed    int64   `json:"redis_used_memory_bytes"`
	RedisDBSize  int64   `json:"redis_dbsize"`
	RedisPerKey  float64 `json:"redis_bytes_per_key"`
	// The parts of RedisPerKey: the keys' entries (bucket, share and
	// escrow together: a Redis key of its own, or a field of a group
	// hash) and the exchange's persisted records.
	Entries      int64   `json:"redis_key_entries"`
	Groups       int64   `json:"redis_groups"`
	PerEntry     float64 `json:"redis_bytes_per_key_entry"`
	GroupsHT     int64   `json:"redis_groups_hashtable"`
	XchgGroupsHT int64   `json:"exchange_state_groups_hashtable"`
	XchgRecords  int64   `json:"exchange_records"`
	PerXchgRec   float64 `json:"exchange_state_bytes_per_record"`
	RedisCPU     float64 `json:"redis_cpu_s_per_s"`
	NATSIn       float64 `json:"nats_in_bytes_per_s"`
	NATSOut      float64 `json:"nats_out_bytes_per_s"`
	AgentKeys    int     `json:"agent_keys"`
	Admitted     float64 `json:"admitted_per_s"`
	Denied       float64 `json:"denied_per_s"`
	FailureMode  float64 `json:"failure_mode_per_s"`
}

// allLine is the whole run's figures for one interval.
type allLine struct {
	Kind       string  `json:"kind"` // "all"
	T          float64 `json:"t_s"`
	ActiveKeys int64   `json:"active_keys"`
	SweepLag   int64   `json:"sweep_lag_keys"`
	Driven     float64 `json:"decisions_per_s"`
	NATSIn     float64 `json:"nats_in_bytes_per_s"`
	NATSOut    float64 `json:"nats_out_bytes_per_s"`
	HarnessCPU float64 `json:"harness_cpu_s_per_s"`
	LoadAvg    float64 `json:"load_average_1m"`
	// RedisPerActive is every Redis's used_memory above its start over
	// the active keys: what the deployment keeps per key, in all regions.
	RedisEntries   int64   `json:"redis_key_entries"`
	RedisPerActive float64 `json:"redis_bytes_per_active_key"`
	AgentHeap      int64   `json:"agent_heap_bytes"`
	AgentKeys      int     `json:"agent_keys"`
	AgentPerKey    float64 `json:"agent_bytes_per_key"`
}

// counters turn cumulative counters into what changed over the interval:
// each call keeps the value for the next interval. A counter that went
// down (a reconnected NATS client) counts as unchanged.
type counters struct {
	prev map[string]float64
	dt   float64 // seconds in the interval; 0 on the first sample
}

func (c *counters) delta(name string, cur float64) float64 {
	if c.prev == nil {
		c.prev = map[string]float64{}
	}
	prev, seen := c.prev[name]
	c.prev[name] = cur
	if !seen || cur < prev {
		return 0
	}
	return cur - prev
}

// rate is delta per second.
func (c *counters) rate(name string, cur float64) float64 {
	d := c.delta(name, cur)
	if c.dt <= 0 {
		return 0
	}
	return d / c.dt
}

// target is one region as the sampler sees it.
type target struct {
	name   string
	daemon *regiondProc
	redis  *child
	rc     *redis.Client
	agents []*agent.Agent
	base   int64 // redis used_memory before the load
	line   regionLine
	count  counters
}

// sampler takes the figures of every interval.
type sampler struct {
	ns       *server.Server
	regions  []*target
	gen      *generator
	hc       *http.Client
	heapBase int64 // harness heap before the load
	start    time.Time
	last     time.Time
	all      allLine
	count    counters
	swept    []sweptAt     // the sweep's progress at each sample, for active
	idle     time.Duration // the regions' IdleAfter
}

// sweptAt is how many keys the sweep had dispatched at t.
type sweptAt struct {
	t     time.Time
	swept int64
}

// active is how many distinct keys were decided within the regions' idle
// time before now (the sweep goes in key order, so the last n ≤ keys it
// dispatched are distinct), as far as the samples resolve it: counted from
// the latest sample at least the regions' idle time old, or from the
// start.
func (s *sampler) active(now time.Time) int64 {
	cur := s.gen.swept.Load()
	s.swept = append(s.swept, sweptAt{now, cur})
	var from int64
	for len(s.swept) > 1 && now.Sub(s.swept[1].t) >= s.idle {
		s.swept = s.swept[1:]
	}
	if now.Sub(s.swept[0].t) >= s.idle {
		from = s.swept[0].swept
	}
	return min(cur-from, int64(s.gen.cfg.keys))
}

// liveHeap collects garbage and returns the live heap of the harness: the
// agents' state, plus the generator's and the embedded NATS server's.
func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// baseline records the figures before the load starts.
func (s *sampler) baseline(ctx context.Context) error {
	if err := s.sample(ctx, time.Now()); err != nil {
		return err
	}
	for _, t := range s.regions {
		t.base = t.line.RedisUsed
	}
	s.heapBase = liveHeap()
	return nil
}

// sample fills every line for the interval ending at now.
func (s *sampler) sample(ctx context.Context, now time.Time) error {
	dt := 0.0
	if !s.last.IsZero() {
		dt = now.Sub(s.last).Seconds()
	}
	s.last, s.count.dt = now, dt
	conns, err := s.ns.Connz(&server.ConnzOptions{Limit: 1 << 16})
	if err != nil {
		return fmt.Errorf("nats connz: %w", err)
	}
	active := s.active(now)
	for _, t := range s.regions {
		t.count.dt = dt
		t.line = regionLine{Kind: "region", T: now.Sub(s.start).Seconds(), Region: t.name, PID: t.daemon.pid()}
		err := t.sampleDaemon(ctx, s.hc)
		if err == nil {
			err = t.sampleRedis(ctx)
		}
		if err != nil {
			return fmt.Errorf("region %s: %w", t.name, err)
		}
		t.sampleNATS(conns)
		t.sampleAgents()
	}
	return s.sampleAll(now, active)
}

// sampleDaemon reads regiond's /proc figures and its /metrics.
func (t *target) sampleDaemon(ctx context.Context, hc *http.Client) error {
	for _, c := range []*child{t.daemon.child, t.redis} {
		if c.exited() {
			return c.failure("exited during the run")
		}
	}
	l := &t.line
	pu, err := readProc(t.daemon.pid())
	if err != nil {
		return err
	}
	l.RSS, l.CPU = pu.rss, t.count.rate("cpu", pu.cpu)
	m, err := scrapeMetrics(ctx, hc, t.daemon.admin)
	if err != nil {
		return err
	}
	l.HeapInuse = m.heapInuse
	l.Epochs = t.count.delta("epochs", float64(m.epochCount))
	if took := t.count.delta("epoch seconds", m.epochSum); l.Epochs > 0 {
		l.EpochMS = took / l.Epochs * 1e3
	}
	l.LeaseItems = t.count.rate("lease items", m.leaseItems)
	l.LeaseErrors = t.count.delta("lease errors", m.leaseErrors)
	l.XchgErrors = t.count.delta("exchange errors", m.exchangeErrors)
	l.SaveErrors = t.count.delta("save errors", m.saveErrors)
	l.StateWritten = t.count.rate("state written", m.stateWritten)
	l.ShareWrites = t.count.rate("share writes", m.shareWrites)
	l.ShareDefer = t.count.rate("share writes deferred", m.shareDeferred)
	return nil
}

// sampleRedis reads the region's Redis: memory, keys and CPU.
func (t *target) sampleRedis(ctx context.Context) error {
	l := &t.line
	ru, err := readProc(t.redis.pid())
	if err != nil {
		return err
	}
	l.RedisCPU = t.count.rate("redis cpu", ru.cpu)
	rm, err := readRedis(ctx, t.rc, t.name)
	if err != nil {
		return err
	}
	l.RedisUsed, l.RedisDBSize = rm.used, rm.dbsize
	// A key ration holds state for in this Redis has an entry, an
	// exchange record, or both: dividing by the larger count is the
	// per-key figure at its highest. An entry costs what is not the
	// exchange's state; a record, the state's bytes over its records.
	l.Entries, l.Groups, l.XchgRecords = rm.entries(), rm.groups, rm.xrecords
	l.GroupsHT, l.XchgGroupsHT = rm.groupsHT, rm.xgroupsHT
	if held := max(l.Entries, l.XchgRecords); held > 0 {
		l.RedisPerKey = float64(rm.used-t.base) / float64(held)
	}
	if l.Entries > 0 {
		l.PerEntry = float64(rm.used-t.base-rm.xbytes) / float64(l.Entries)
	}
	if l.XchgRecords > 0 {
		l.PerXchgRec = float64(rm.xbytes) / float64(l.XchgRecords)
	}
	return nil
}

// sampleNATS takes the bytes of regiond's NATS connection (named "regiond
// <region>/<replica>"): in is what it published, out what it received.
func (t *target) sampleNATS(conns *server.Connz) {
	var in, out int64
	for _, c := range conns.Conns {
		if strings.HasPrefix(c.Name, "regiond "+t.name+"/") {
			in, out = in+c.InBytes, out+c.OutBytes
		}
	}
	t.line.NATSIn, t.line.NATSOut = t.count.rate("nats in", float64(in)), t.count.rate("nats out", float64(out))
}

// sampleAgents sums the region's agents' keys and decisions.
func (t *target) sampleAgents() {
	var adm, den, fail uint64
	for _, a := range t.agents {
		st := a.Stats()
		t.line.AgentKeys += st.Keys
		for p := range st.Decisions {
			den, adm = den+st.Decisions[p][0], adm+st.Decisions[p][1]
		}
		for _, p := range []agent.Path{agent.PathFallbackLocal, agent.PathFailedOpen, agent.PathFailedClosed} {
			fail += st.Decisions[p][0] + st.Decisions[p][1]
		}
	}
	t.line.Admitted = t.count.rate("admitted", float64(adm))
	t.line.Denied = t.count.rate("denied", float64(den))
	t.line.FailureMode = t.count.rate("failure mode", float64(fail))
}

// sampleAll takes the run's figures: the sweep, NATS's totals, the
// harness's CPU and the agents' heap.
func (s *sampler) sampleAll(now time.Time, active int64) error {
	a := &s.all
	*a = allLine{Kind: "all", T: now.Sub(s.start).Seconds(), ActiveKeys: active, SweepLag: s.gen.lag(now)}
	a.Driven = s.count.rate("driven", float64(s.gen.swept.Load()+s.gen.hot.Load()))
	v, err := s.ns.Varz(&server.VarzOptions{})
	if err != nil {
		return fmt.Errorf("nats varz: %w", err)
	}
	a.NATSIn, a.NATSOut = s.count.rate("nats in", float64(v.InBytes)), s.count.rate("nats out", float64(v.OutBytes))
	self, err := readProc(os.Getpid())
	if err != nil {
		return err
	}
	a.HarnessCPU = s.count.rate("cpu", self.cpu)
	a.LoadAvg = loadAverage()
	a.AgentHeap = liveHeap() - s.heapBase
	var above int64
	for _, t := range s.regions {
		a.AgentKeys += t.line.AgentKeys
		a.RedisEntries += t.line.Entries
		above += t.line.RedisUsed - t.base
	}
	if active > 0 {
		a.RedisPerActive = float64(above) / float64(active)
	}
	if a.AgentKeys > 0 {
		a.AgentPerKey = float64(a.AgentHeap) / float64(a.AgentKeys)
	}
	return nil
}

// printer writes the lines as text or JSON lines.
type printer struct {
	w    io.Writer
	json bool
}

func (p printer) interval(s *sampler) {
	if p.json {
		enc := json.NewEncoder(p.w)
		for _, t := range s.regions {
			_ = enc.Encode(t.line)
		}
		_ = enc.Encode(s.all)
		return
	}
	a := s.all
	fmt.Fprintf(p.w, "t=%v active keys %d (sweep lag %d; %d entries in the Redises, %.0f B/active key in all), driven %.0f/s, harness cpu %.2f s/s, load %.1f, nats in %s/s out %s/s\n",
		time.Duration(a.T*float64(time.Second)).Round(time.Second), a.ActiveKeys, a.SweepLag, a.RedisEntries, a.RedisPerActive, a.Driven, a.HarnessCPU, a.LoadAvg, mb(a.NATSIn), mb(a.NATSOut))
	fmt.Fprintf(p.w, "  %-4s %8s %6s %8s %8s %8s %6s %6s %6s %7s %7s %9s %9s %8s %7s %8s %6s %7s %6s %6s %9s %9s %9s %8s %8s %6s\n",
		"reg", "rss", "cpu/s", "heap", "epoch", "items/s", "l-err", "x-err", "x-save", "share/s", "defer/s", "state-w/s", "redis", "entries", "B/entry", "xrecs", "B/xrec", "ht", "B/key", "rcpu/s", "nats-in/s", "nats-out/s", "agentkeys", "adm/s", "den/s", "fail/s")
	for _, t := range s.regions {
		l := t.line
		fmt.Fprintf(p.w, "  %-4s %8s %6.2f %8s %6.0fms %8.0f %6.0f %6.0f %6.0f %7.0f %7.0f %9s %9s %8d %7.0f %8d %6.0f %7s %6.0f %6.2f %9s %9s %9d %8.0f %8.0f %6.0f\n",
			l.Region, mb(float64(l.RSS)), l.CPU, mb(float64(l.HeapInuse)), l.EpochMS, l.LeaseItems, l.LeaseErrors, l.XchgErrors, l.SaveErrors, l.ShareWrites, l.ShareDefer, mb(l.StateWritten), mb(float64(l.RedisUsed)),
			l.Entries, l.PerEntry, l.XchgRecords, l.PerXchgRec, fmt.Sprintf("%d/%d", l.GroupsHT, l.XchgGroupsHT), l.RedisPerKey, l.RedisCPU, mb(l.NATSIn), mb(l.NATSOut), l.AgentKeys, l.Admitted, l.Denied, l.FailureMode)
	}
	fmt.Fprintf(p.w, "  agents: %d keys held, live heap %s above the start, %.0f B/key\n", a.AgentKeys, mb(float64(a.AgentHeap)), a.AgentPerKey)
}

// mb formats bytes in MB (10^6) with one decimal.
func mb(b float64) string { return fmt.Sprintf("%.1fMB", b/1e6) }
