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
	Kind          string  `json:"kind"` // "region"
	T             float64 `json:"t_s"`
	Region        string  `json:"region"`
	PID           int     `json:"pid"`
	RSS           int64   `json:"rss_bytes"`
	CPU           float64 `json:"cpu_s_per_s"`
	HeapInuse     int64   `json:"heap_inuse_bytes"`
	Epochs        int64   `json:"epochs"`
	EpochMS       float64 `json:"epoch_ms_mean"`
	LeaseItems    float64 `json:"lease_items_per_s"`
	LeaseErrors   float64 `json:"lease_store_errors"`
	XchgErrors    float64 `json:"exchange_store_errors"`
	RedisUsed     int64   `json:"redis_used_memory_bytes"`
	RedisKeys     int64   `json:"redis_dbsize"`
	RedisPerRKey  float64 `json:"redis_bytes_per_redis_key"`
	RedisPerKey   float64 `json:"redis_bytes_per_active_key"`
	RedisCPU      float64 `json:"redis_cpu_s_per_s"`
	NATSIn        float64 `json:"nats_in_bytes_per_s"`
	NATSOut       float64 `json:"nats_out_bytes_per_s"`
	AgentKeys     int     `json:"agent_keys"`
	Admitted      float64 `json:"admitted_per_s"`
	Denied        float64 `json:"denied_per_s"`
	FailureMode   float64 `json:"failure_mode_per_s"`
	prevCPU       float64
	prevRedisCPU  float64
	prevEpochSum  float64
	prevConnIn    int64
	prevConnOut   int64
	prevAdmitted  uint64
	prevDenied    uint64
	prevFailure   uint64
	prevEpochsCnt int64
	prevItems     float64
	prevLeaseErrs float64
	prevXchgErrs  float64
}

// allLine is the whole run's figures for one interval.
type allLine struct {
	Kind         string  `json:"kind"` // "all"
	T            float64 `json:"t_s"`
	ActiveKeys   int64   `json:"active_keys"`
	SweepLag     int64   `json:"sweep_lag_keys"`
	Driven       float64 `json:"decisions_per_s"`
	NATSIn       float64 `json:"nats_in_bytes_per_s"`
	NATSOut      float64 `json:"nats_out_bytes_per_s"`
	HarnessCPU   float64 `json:"harness_cpu_s_per_s"`
	AgentHeap    int64   `json:"agent_heap_bytes"`
	AgentKeys    int     `json:"agent_keys"`
	AgentPerKey  float64 `json:"agent_bytes_per_key"`
	prevInBytes  int64
	prevOutBytes int64
	prevCPU      float64
	prevDriven   int64
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
}

// sampler takes the figures of every interval; it keeps the previous
// counters to turn them into rates.
type sampler struct {
	ns       *server.Server
	regions  []*target
	gen      *generator
	hc       *http.Client
	heapBase int64 // harness heap before the load
	start    time.Time
	last     time.Time
	all      allLine
	swept    []sweptAt // the sweep's progress at each sample, for active
}

// sweptAt is how many keys the sweep had dispatched at t.
type sweptAt struct {
	t     time.Time
	swept int64
}

// active is how many distinct keys were decided within the regions' idle
// time before now (the sweep goes in key order, so the last n ≤ keys it
// dispatched are distinct), as far as the samples resolve it: counted from
// the latest sample at least regionIdle old, or from the start.
func (s *sampler) active(now time.Time) int64 {
	cur := s.gen.swept.Load()
	s.swept = append(s.swept, sweptAt{now, cur})
	var from int64
	for len(s.swept) > 1 && now.Sub(s.swept[1].t) >= regionIdle {
		s.swept = s.swept[1:]
	}
	if now.Sub(s.swept[0].t) >= regionIdle {
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
	if _, err := s.sample(ctx, time.Now()); err != nil {
		return err
	}
	for _, t := range s.regions {
		t.base = t.line.RedisUsed
	}
	s.heapBase = liveHeap()
	return nil
}

// sample fills every line for the interval ending at now.
func (s *sampler) sample(ctx context.Context, now time.Time) (dt float64, err error) {
	dt = now.Sub(s.last).Seconds()
	if s.last.IsZero() {
		dt = 0
	}
	s.last = now
	rate := func(cur, prev float64) float64 {
		if dt <= 0 || cur < prev {
			return 0
		}
		return (cur - prev) / dt
	}
	conns, err := s.ns.Connz(&server.ConnzOptions{Limit: 1 << 16})
	if err != nil {
		return 0, fmt.Errorf("nats connz: %w", err)
	}
	active := s.active(now)
	for _, t := range s.regions {
		if err := s.sampleRegion(ctx, t, now, conns, active, rate); err != nil {
			return 0, fmt.Errorf("region %s: %w", t.name, err)
		}
	}
	return dt, s.sampleAll(now, active, rate)
}

func (s *sampler) sampleRegion(ctx context.Context, t *target, now time.Time, conns *server.Connz, active int64, rate func(cur, prev float64) float64) error {
	l := &t.line
	l.Kind, l.T, l.Region, l.PID = "region", now.Sub(s.start).Seconds(), t.name, t.daemon.pid()
	for _, c := range []*child{t.daemon.child, t.redis} {
		if c.exited() {
			return c.failure("exited during the run")
		}
	}
	pu, err := readProc(t.daemon.pid())
	if err != nil {
		return err
	}
	l.RSS, l.CPU, l.prevCPU = pu.rss, rate(pu.cpu, l.prevCPU), pu.cpu
	ru, err := readProc(t.redis.pid())
	if err != nil {
		return err
	}
	l.RedisCPU, l.prevRedisCPU = rate(ru.cpu, l.prevRedisCPU), ru.cpu
	m, err := scrapeMetrics(ctx, s.hc, t.daemon.admin)
	if err != nil {
		return err
	}
	l.HeapInuse = m.heapInuse
	l.Epochs, l.EpochMS = m.epochCount-l.prevEpochsCnt, 0
	if l.Epochs > 0 {
		l.EpochMS = (m.epochSum - l.prevEpochSum) / float64(l.Epochs) * 1e3
	}
	l.prevEpochsCnt, l.prevEpochSum = m.epochCount, m.epochSum
	l.LeaseItems, l.prevItems = rate(m.leaseItems, l.prevItems), m.leaseItems
	l.LeaseErrors, l.prevLeaseErrs = max(0, m.leaseErrors-l.prevLeaseErrs), m.leaseErrors
	l.XchgErrors, l.prevXchgErrs = max(0, m.exchangeErrors-l.prevXchgErrs), m.exchangeErrors
	rm, err := readRedis(ctx, t.rc)
	if err != nil {
		return err
	}
	l.RedisUsed, l.RedisKeys, l.RedisPerRKey, l.RedisPerKey = rm.used, rm.keys, 0, 0
	if rm.keys > 0 {
		l.RedisPerRKey = float64(rm.used) / float64(rm.keys)
	}
	if active > 0 {
		l.RedisPerKey = float64(rm.used-t.base) / float64(active)
	}
	var in, out int64
	for _, c := range conns.Conns {
		if strings.HasPrefix(c.Name, "regiond "+t.name+"/") {
			in, out = in+c.InBytes, out+c.OutBytes
		}
	}
	l.NATSIn, l.NATSOut = rate(float64(in), float64(l.prevConnIn)), rate(float64(out), float64(l.prevConnOut))
	l.prevConnIn, l.prevConnOut = in, out
	var adm, den, fail uint64
	l.AgentKeys = 0
	for _, a := range t.agents {
		st := a.Stats()
		l.AgentKeys += st.Keys
		for p := range st.Decisions {
			den, adm = den+st.Decisions[p][0], adm+st.Decisions[p][1]
		}
		for _, p := range []agent.Path{agent.PathFallbackLocal, agent.PathFailedOpen, agent.PathFailedClosed} {
			fail += st.Decisions[p][0] + st.Decisions[p][1]
		}
	}
	l.Admitted, l.Denied, l.FailureMode = rate(float64(adm), float64(l.prevAdmitted)), rate(float64(den), float64(l.prevDenied)), rate(float64(fail), float64(l.prevFailure))
	l.prevAdmitted, l.prevDenied, l.prevFailure = adm, den, fail
	return nil
}

func (s *sampler) sampleAll(now time.Time, active int64, rate func(cur, prev float64) float64) error {
	a := &s.all
	a.Kind, a.T, a.ActiveKeys, a.SweepLag = "all", now.Sub(s.start).Seconds(), active, s.gen.lag(now)
	driven := s.gen.swept.Load() + s.gen.hot.Load()
	a.Driven, a.prevDriven = rate(float64(driven), float64(a.prevDriven)), driven
	v, err := s.ns.Varz(&server.VarzOptions{})
	if err != nil {
		return fmt.Errorf("nats varz: %w", err)
	}
	a.NATSIn, a.NATSOut = rate(float64(v.InBytes), float64(a.prevInBytes)), rate(float64(v.OutBytes), float64(a.prevOutBytes))
	a.prevInBytes, a.prevOutBytes = v.InBytes, v.OutBytes
	self, err := readProc(os.Getpid())
	if err != nil {
		return err
	}
	a.HarnessCPU, a.prevCPU = rate(self.cpu, a.prevCPU), self.cpu
	a.AgentHeap = liveHeap() - s.heapBase
	a.AgentKeys, a.AgentPerKey = 0, 0
	for _, t := range s.regions {
		a.AgentKeys += t.line.AgentKeys
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
	fmt.Fprintf(p.w, "t=%v active keys %d (sweep lag %d), driven %.0f/s, harness cpu %.2f s/s, nats in %s/s out %s/s\n",
		time.Duration(a.T*float64(time.Second)).Round(time.Second), a.ActiveKeys, a.SweepLag, a.Driven, a.HarnessCPU, mb(a.NATSIn), mb(a.NATSOut))
	fmt.Fprintf(p.w, "  %-4s %8s %6s %8s %8s %8s %6s %6s %9s %9s %7s %6s %6s %9s %9s %9s %8s %8s %6s\n",
		"reg", "rss", "cpu/s", "heap", "epoch", "items/s", "l-err", "x-err", "redis", "dbsize", "B/rkey", "B/key", "rcpu/s", "nats-in/s", "nats-out/s", "agentkeys", "adm/s", "den/s", "fail/s")
	for _, t := range s.regions {
		l := t.line
		fmt.Fprintf(p.w, "  %-4s %8s %6.2f %8s %6.0fms %8.0f %6.0f %6.0f %9s %9d %7.0f %6.0f %6.2f %9s %9s %9d %8.0f %8.0f %6.0f\n",
			l.Region, mb(float64(l.RSS)), l.CPU, mb(float64(l.HeapInuse)), l.EpochMS, l.LeaseItems, l.LeaseErrors, l.XchgErrors, mb(float64(l.RedisUsed)), l.RedisKeys,
			l.RedisPerRKey, l.RedisPerKey, l.RedisCPU, mb(l.NATSIn), mb(l.NATSOut), l.AgentKeys, l.Admitted, l.Denied, l.FailureMode)
	}
	fmt.Fprintf(p.w, "  agents: %d keys held, live heap %s above the start, %.0f B/key\n", a.AgentKeys, mb(float64(a.AgentHeap)), a.AgentPerKey)
}

// mb formats bytes in MB (10^6) with one decimal.
func mb(b float64) string { return fmt.Sprintf("%.1fMB", b/1e6) }
