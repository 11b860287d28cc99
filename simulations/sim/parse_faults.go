package sim

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/internal/yamlfield"
)

func (p *parser) faults(v *yaml.Node, sc *Scenario) []Fault {
	if v.Kind != yaml.SequenceNode {
		p.Errorf(v.Line, "faults", "must be a list (got %s)", yamlfield.Describe(v))
		return nil
	}
	var out []Fault
	for i, n := range v.Content {
		if f, ok := p.fault(n, fmt.Sprintf("faults[%d]", i), sc); ok {
			out = append(out, f)
		}
	}
	return out
}

var (
	faultFields = []string{"at", "partition", "for", "redis_failover", "lost_writes", "crash_agents", "add_agents",
		"region", "unreachable", "restart", "policy_mismatch", "limit_factor", "crash_proxies", "disconnect_proxies"}
	faultKinds = []string{"partition", "redis_failover", "crash_agents", "add_agents", "unreachable", "restart", "policy_mismatch",
		"crash_proxies", "disconnect_proxies"}
	// faultOptions are the fields other than at and the kind's own that
	// each kind takes.
	faultOptions = map[string][]string{
		"partition":      {"for"},
		"redis_failover": {"lost_writes"},
		"crash_agents":   {"region", "for"},
		"add_agents":     {"region"},
		"unreachable":    {"for"},
		"restart":        {"for"},
		// The region's policy gives every rule limit_factor × its limit
		// and burst (default 10) for a while: a policy that reached one
		// region and not the others.
		"policy_mismatch": {"for", "limit_factor"},
		// RLQS proxies (parse_rlqs.go).
		"crash_proxies":      {"region", "for"},
		"disconnect_proxies": {"region", "for"},
	}
)

// fault decodes one fault. It returns ok=false when n is not a mapping or
// does not name exactly one kind.
func (p *parser) fault(n *yaml.Node, path string, sc *Scenario) (Fault, bool) {
	fs, ok := p.mapping(n, path, faultFields...)
	if !ok {
		return Fault{}, false
	}
	f := Fault{Line: n.Line}
	if af, ok := p.required(fs, path, "at"); ok {
		f.At, _ = p.duration(af, path+".at")
	}
	kinds := 0
	for _, kind := range faultKinds {
		if _, ok := fs.Get(kind); ok {
			kinds++
			f.Kind = kind
		}
	}
	if kinds != 1 {
		p.Errorf(n.Line, path, "needs exactly one of %s", strings.Join(faultKinds, ", "))
		return Fault{}, false
	}
	for _, name := range []string{"for", "lost_writes", "region", "limit_factor"} {
		if o, ok := fs.Get(name); ok && !slices.Contains(faultOptions[f.Kind], name) {
			p.Errorf(o.Key.Line, path+"."+name, "does not apply to %s", f.Kind)
		}
	}
	p.faultRegion(fs, path, sc, &f)
	p.faultValues(fs, path, &f)
	return f, true
}

// faultRegion decodes the region a fault strikes: the value of its kind,
// or its region field for the kinds whose value is an amount.
func (p *parser) faultRegion(fs fields, path string, sc *Scenario, f *Fault) {
	name := f.Kind
	if f.Kind == "crash_agents" || f.Kind == "add_agents" || f.Kind == "crash_proxies" || f.Kind == "disconnect_proxies" {
		if _, ok := fs.Get("region"); !ok {
			p.Errorf(fs.line, path+".region", "is required for %s", f.Kind)
			return
		}
		name = "region"
	}
	rf, _ := fs.Get(name)
	if s, ok := p.Str(rf, path+"."+name); ok {
		if sc.regionIndex(s) < 0 {
			p.Errorf(rf.Key.Line, path+"."+name, "unknown region %q (regions: %s)", s, strings.Join(sc.Regions, ", "))
		}
		f.Region = s
	}
}

// faultValues decodes how long a fault lasts and how much it strikes.
func (p *parser) faultValues(fs fields, path string, f *Fault) {
	if v, ok := fs.Get("for"); ok {
		f.For, _ = p.duration(v, path+".for")
	} else if f.Kind == "partition" || f.Kind == "unreachable" || f.Kind == "restart" || f.Kind == "policy_mismatch" || f.Kind == "disconnect_proxies" {
		p.Errorf(fs.line, path+".for", "is required for %s", f.Kind)
	}
	if f.Kind == "policy_mismatch" {
		f.Factor = 10
	}
	if v, ok := fs.Get("limit_factor"); ok {
		if x, ok := p.Number(v, path+".limit_factor"); ok {
			if x <= 0 || x > 1000 || x == 1 {
				p.Errorf(v.Key.Line, path+".limit_factor", "must be in (0, 1000] and not 1")
			}
			f.Factor = x
		}
	}
	if v, ok := fs.Get("lost_writes"); ok {
		f.LostWrites, _ = p.duration(v, path+".lost_writes")
	}
	if v, ok := fs.Get("crash_agents"); ok {
		if x, ok := p.Number(v, path+".crash_agents"); ok {
			if x <= 0 || x > 1 {
				p.Errorf(v.Key.Line, path+".crash_agents", "must be a fraction in (0, 1]")
			}
			f.Fraction = x
		}
	}
	for _, kind := range []string{"crash_proxies", "disconnect_proxies"} {
		if v, ok := fs.Get(kind); ok {
			if x, ok := p.intIn(v, path+"."+kind, 1, 100_000, "1, 100000"); ok {
				f.Proxies = int(x)
			}
		}
	}
	if v, ok := fs.Get("add_agents"); ok {
		if x, ok := p.intIn(v, path+".add_agents", 1, 100_000, "1, 100000"); ok {
			f.Agents = int(x)
		}
	}
}
