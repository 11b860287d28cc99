package sim

import (
	"fmt"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/internal/yamlfield"
	"github.com/ration-dev/ration/lease/agent"
	leasev1 "github.com/ration-dev/ration/lease/v1"
)

// LoadFile reads and parses a scenario file.
func LoadFile(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes and validates a scenario, in the manner of the policy
// package: every problem is reported with its file, line and field, unknown
// fields are errors, and a bad document returns no Scenario. The error
// is an Errors, which wraps ErrInvalid.
func Parse(file string, data []byte) (*Scenario, error) {
	p := &parser{yamlfield.Checker[invalidScenario]{File: file}}
	sc := p.document(data)
	if err := p.Err(); err != nil {
		return nil, err
	}
	sc.File = file
	return sc, nil
}

type parser struct {
	yamlfield.Checker[invalidScenario]
}

// fields is a mapping's checked entries and the mapping's line, where a
// missing field is reported.
type fields struct {
	yamlfield.Fields
	line int
}

func (p *parser) mapping(n *yaml.Node, path string, known ...string) (fields, bool) {
	if n.Kind != yaml.MappingNode {
		p.Errorf(n.Line, path, "must be a mapping (got %s)", yamlfield.Describe(n))
		return fields{line: n.Line}, false
	}
	return fields{Fields: p.Fields(n, path, known...), line: n.Line}, true
}

// required returns the field name of the mapping at path, recording a
// problem when it is missing.
func (p *parser) required(fs fields, path, name string) (yamlfield.Field, bool) {
	f, ok := fs.Get(name)
	if !ok {
		p.Errorf(fs.line, yamlfield.Join(path, name), "is required")
	}
	return f, ok
}

// nonEmptyList returns the elements of a non-empty list, or none after
// recording a problem ("must be a non-empty list" and of).
func (p *parser) nonEmptyList(f yamlfield.Field, path, of string) []*yaml.Node {
	if f.Val.Kind != yaml.SequenceNode || len(f.Val.Content) == 0 {
		p.Errorf(f.Key.Line, path, "must be a non-empty list%s (got %s)", of, yamlfield.Describe(f.Val))
		return nil
	}
	return f.Val.Content
}

// duration decodes a Go duration string that is not negative (a bare 0
// is zero).
func (p *parser) duration(f yamlfield.Field, path string) (time.Duration, bool) {
	d, ok := yamlfield.ParseDuration(f.Val)
	if !ok {
		p.Errorf(f.Key.Line, path, `must be a Go duration such as "1s" or "500ms" (got %s)`, yamlfield.Describe(f.Val))
		return 0, false
	}
	if d < 0 {
		p.Errorf(f.Key.Line, path, "must not be negative")
		return 0, false
	}
	return d, true
}

// intIn decodes an integer, recording a problem ("must be in [rng]") when
// it is outside [lo, hi]; ok reports that it decoded, in range or not.
func (p *parser) intIn(f yamlfield.Field, path string, lo, hi int64, rng string) (int64, bool) {
	x, ok := p.Int(f, path)
	if ok && (x < lo || x > hi) {
		p.Errorf(f.Key.Line, path, "must be in [%s]", rng)
	}
	return x, ok
}

var scenarioFields = []string{"name", "seed", "start", "duration", "step", "grid", "sample", "regions",
	"agents_per_region", "sync_period", "lease_ttl", "lease_period", "network", "redis", "keys", "demand", "faults", "rlqs"}

func (p *parser) document(data []byte) *Scenario {
	root := p.Root(data, yamlfield.Document{Empty: "document is empty"})
	if root == nil {
		return nil
	}
	fs, ok := p.mapping(root, "", scenarioFields...)
	if !ok {
		return nil
	}
	sc := &Scenario{
		Start: time.Unix(defaultStart, 0).UTC(),
		Step:  time.Millisecond, SyncPeriod: time.Second, LeaseTTL: leasev1.DefaultLeaseTTL,
		LeasePeriod: agent.DefaultLeasePeriod, AgentsPerRegion: 1,
		Network: Network{AgentRTT: time.Millisecond, AgentJitter: 200 * time.Microsecond},
		Redis:   Redis{Latency: 500 * time.Microsecond},
	}
	p.head(fs, sc)
	p.start(fs, sc)
	p.times(fs, sc)
	p.body(fs, sc)
	p.checkTimes(fs, sc)
	return sc
}

// head decodes the name and the seed.
func (p *parser) head(fs fields, sc *Scenario) {
	if f, ok := p.required(fs, "", "name"); ok {
		sc.Name, _ = p.Str(f, "name")
	}
	if f, ok := fs.Get("seed"); ok {
		// Seeds are unsigned 64-bit, as the command's -seed flag takes them.
		if v := f.Val; v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || v.Decode(&sc.Seed) != nil {
			p.Errorf(f.Key.Line, "seed", "must be an integer in [0, 2^64) (got %s)", yamlfield.Describe(v))
		}
	}
}

// The range of a run's start: the stores keep fixed windows' boundaries in
// Unix microseconds, positive and below 2^53 (year 2255), and a window
// before the start's must fit too.
var (
	earliestStart = time.Date(1971, 1, 1, 0, 0, 0, 0, time.UTC)
	latestStart   = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// start decodes the wall-clock instant the run starts at.
func (p *parser) start(fs fields, sc *Scenario) {
	f, ok := fs.Get("start")
	if !ok {
		return
	}
	// Unquoted, YAML reads an RFC 3339 time as a timestamp, quoted as a
	// string: the text is the same.
	v := f.Val
	if v.Kind != yaml.ScalarNode || (v.ShortTag() != "!!str" && v.ShortTag() != "!!timestamp") {
		p.Errorf(f.Key.Line, "start", `must be an RFC 3339 time such as "2026-03-29T00:58:00+01:00" (got %s)`, yamlfield.Describe(v))
		return
	}
	t, err := time.Parse(time.RFC3339Nano, v.Value)
	switch {
	case err != nil:
		p.Errorf(f.Key.Line, "start", `must be an RFC 3339 time with a date, a time and an offset, such as "2026-03-29T00:58:00+01:00" (got %q)`, yamlfield.Clip(v.Value))
	case t.Before(earliestStart) || !t.Before(latestStart):
		p.Errorf(f.Key.Line, "start", "must be from 1971 to 2199 (got %s)", yamlfield.Clip(v.Value))
	default:
		sc.Start = t
	}
}

// times decodes the duration and the clocks' periods.
func (p *parser) times(fs fields, sc *Scenario) {
	if f, ok := p.required(fs, "", "duration"); ok {
		if d, ok := p.duration(f, "duration"); ok {
			if d <= 0 {
				p.Errorf(f.Key.Line, "duration", "must be > 0")
			}
			sc.Duration = d
		}
	}
	durs := []struct {
		name string
		dst  *time.Duration
	}{{"step", &sc.Step}, {"grid", &sc.Grid}, {"sample", &sc.Sample}, {"sync_period", &sc.SyncPeriod},
		{"lease_ttl", &sc.LeaseTTL}, {"lease_period", &sc.LeasePeriod}}
	for _, d := range durs {
		if f, ok := fs.Get(d.name); ok {
			if x, ok := p.duration(f, d.name); ok {
				if x <= 0 {
					p.Errorf(f.Key.Line, d.name, "must be > 0")
				} else {
					*d.dst = x
				}
			}
		}
	}
}

// body decodes the regions, their models, the keys, demand and faults.
func (p *parser) body(fs fields, sc *Scenario) {
	if f, ok := p.required(fs, "", "regions"); ok {
		sc.Regions = p.regions(f)
	}
	if f, ok := fs.Get("agents_per_region"); ok {
		if x, ok := p.intIn(f, "agents_per_region", 1, 100_000, "1, 100000"); ok {
			sc.AgentsPerRegion = int(x)
		}
	}
	if f, ok := fs.Get("network"); ok {
		p.network(f.Val, &sc.Network)
	}
	if f, ok := fs.Get("redis"); ok {
		if rf, ok := p.mapping(f.Val, "redis", "latency"); ok {
			if f, ok := rf.Get("latency"); ok {
				sc.Redis.Latency, _ = p.duration(f, "redis.latency")
			}
		}
	}
	if f, ok := p.required(fs, "", "keys"); ok {
		sc.Keys = p.keys(f)
	}
	if f, ok := p.required(fs, "", "demand"); ok {
		sc.Demand = p.demand(f, sc)
	}
	if f, ok := fs.Get("faults"); ok {
		sc.Faults = p.faults(f.Val, sc)
	}
	if f, ok := fs.Get("rlqs"); ok {
		sc.RLQS = p.rlqs(f.Val, sc)
	}
	p.checkProxyFaults(sc)
}

// checkTimes validates what depends on several fields.
func (p *parser) checkTimes(fs fields, sc *Scenario) {
	line := func(name string) int {
		if f, ok := fs.Get(name); ok {
			return f.Key.Line
		}
		return fs.line
	}
	if sc.Duration > 0 && sc.Step > 0 && sc.Duration%sc.Step != 0 {
		p.Errorf(line("step"), "step", "must divide duration (%v)", sc.Duration)
	}
	if sc.Step > 100*time.Millisecond {
		p.Errorf(line("step"), "step", "must be at most 100ms")
	}
	if sc.Grid != 0 && sc.Step > 0 && sc.Grid%sc.Step != 0 {
		p.Errorf(line("grid"), "grid", "must be a multiple of step (%v)", sc.Step)
	}
	if sc.Grid > time.Second {
		p.Errorf(line("grid"), "grid", "must be at most 1s")
	}
	if sc.LeaseTTL < sc.LeasePeriod {
		p.Errorf(line("lease_ttl"), "lease_ttl", "must be at least lease_period (%v)", sc.LeasePeriod)
	}
	if sc.SyncPeriod < time.Millisecond {
		p.Errorf(line("sync_period"), "sync_period", "must be at least 1ms")
	}
	p.checkEnds(sc)
}

// checkEnds checks that every fault and demand step but the first starts
// before the end.
func (p *parser) checkEnds(sc *Scenario) {
	for i, f := range sc.Faults {
		if f.At >= sc.Duration {
			p.Errorf(f.Line, fmt.Sprintf("faults[%d].at", i), "must be before the end (%v)", sc.Duration)
		}
	}
	for i, d := range sc.Demand {
		if i > 0 && d.At >= sc.Duration {
			p.Errorf(d.Line, fmt.Sprintf("demand[%d].at", i), "must be before the end (%v)", sc.Duration)
		}
	}
}
