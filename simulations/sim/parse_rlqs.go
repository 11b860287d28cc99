package sim

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/internal/yamlfield"
)

// RLQS is the scenario's Envoy proxies (yaml rlqs): in a region with
// proxies, every request goes to one of them, picked uniformly, and the
// proxy decides it as Envoy's rate_limit_quota filter does, on the
// assignments its region's RLQS server (lease/rlqs's Core) sends it. A
// region without proxies is served by agents.
type RLQS struct {
	// Proxies is each region's proxy count: proxies_per_region (default
	// 0), or the region's entry of proxies.
	Proxies map[string]int
	// ReportInterval is how often a proxy reports every bucket's usage, in
	// one message (default 1s; whole seconds, since Envoy truncates
	// durations to them; Envoy itself reports every 5s today).
	ReportInterval time.Duration
	// Fallback is what a proxy does with a bucket that has no assignment
	// in force: none yet (no_assignment_behavior) or its TTL ran out
	// (expired_assignment_behavior). Default deny_all.
	Fallback ProxyFallback
}

// ProxyFallback is a proxy's behaviour without an assignment: Kind
// "deny_all", "allow_all", or "token_bucket", a token bucket of MaxTokens
// (its initial fill) refilled TokensPerFill every FillInterval.
type ProxyFallback struct {
	Kind                     string
	MaxTokens, TokensPerFill int64
	FillInterval             time.Duration
}

// The proxies' fallback kinds.
const (
	FallbackDenyAll     = "deny_all"
	FallbackAllowAll    = "allow_all"
	FallbackTokenBucket = "token_bucket"
)

// rlqs decodes the rlqs block.
func (p *parser) rlqs(v *yaml.Node, sc *Scenario) *RLQS {
	fs, ok := p.mapping(v, "rlqs", "proxies_per_region", "proxies", "report_interval", "fallback")
	if !ok {
		return nil
	}
	out := &RLQS{Proxies: map[string]int{}, ReportInterval: time.Second, Fallback: ProxyFallback{Kind: FallbackDenyAll}}
	each := 0
	if f, ok := fs.Get("proxies_per_region"); ok {
		if x, ok := p.intIn(f, "rlqs.proxies_per_region", 0, 10_000, "0, 10000"); ok {
			each = int(x)
		}
	}
	for _, r := range sc.Regions {
		out.Proxies[r] = each
	}
	if f, ok := fs.Get("proxies"); ok {
		if rf, ok := p.mapping(f.Val, "rlqs.proxies", sc.Regions...); ok {
			for _, r := range sc.Regions {
				if f, ok := rf.Get(r); ok {
					if x, ok := p.intIn(f, "rlqs.proxies."+r, 0, 10_000, "0, 10000"); ok {
						out.Proxies[r] = int(x)
					}
				}
			}
		}
	}
	total := 0
	for _, n := range out.Proxies {
		total += n
	}
	if total == 0 {
		p.Errorf(fs.line, "rlqs", "no region has proxies: set proxies_per_region or proxies")
	}
	if f, ok := fs.Get("report_interval"); ok {
		if d, ok := p.duration(f, "rlqs.report_interval"); ok {
			if d < time.Second || d%time.Second != 0 {
				p.Errorf(f.Key.Line, "rlqs.report_interval", "must be whole seconds, at least 1s (Envoy truncates durations to seconds; got %v)", d)
			} else {
				out.ReportInterval = d
			}
		}
	}
	if f, ok := fs.Get("fallback"); ok {
		p.fallback(f, &out.Fallback)
	}
	return out
}

// fallback decodes deny_all, allow_all, or a mapping
// {token_bucket: {max_tokens, tokens_per_fill, fill_interval}}.
func (p *parser) fallback(f yamlfield.Field, out *ProxyFallback) {
	const path = "rlqs.fallback"
	if f.Val.Kind == yaml.ScalarNode {
		out.Kind, _ = p.Enum(f, path, FallbackDenyAll, FallbackAllowAll)
		return
	}
	fs, ok := p.mapping(f.Val, path, FallbackTokenBucket)
	if !ok {
		return
	}
	tf, ok := p.required(fs, path, FallbackTokenBucket)
	if !ok {
		return
	}
	const tb = path + "." + FallbackTokenBucket
	bs, ok := p.mapping(tf.Val, tb, "max_tokens", "tokens_per_fill", "fill_interval")
	if !ok {
		return
	}
	out.Kind, out.FillInterval = FallbackTokenBucket, time.Second
	if f, ok := p.required(bs, tb, "max_tokens"); ok {
		if x, ok := p.intIn(f, tb+".max_tokens", 1, 1<<32-1, "1, 4294967295"); ok {
			out.MaxTokens = x
		}
	}
	if f, ok := p.required(bs, tb, "tokens_per_fill"); ok {
		if x, ok := p.intIn(f, tb+".tokens_per_fill", 1, 1<<32-1, "1, 4294967295"); ok {
			out.TokensPerFill = x
		}
	}
	if f, ok := bs.Get("fill_interval"); ok {
		if d, ok := p.duration(f, tb+".fill_interval"); ok {
			if d < time.Second || d%time.Second != 0 {
				p.Errorf(f.Key.Line, tb+".fill_interval", "must be whole seconds, at least 1s (Envoy divides by its seconds; got %v)", d)
			} else {
				out.FillInterval = d
			}
		}
	}
}

// checkProxyFaults checks that every proxy fault strikes a region with
// proxies.
func (p *parser) checkProxyFaults(sc *Scenario) {
	for i, f := range sc.Faults {
		if f.Kind != "crash_proxies" && f.Kind != "disconnect_proxies" || f.Region == "" {
			continue
		}
		if sc.RLQS == nil || sc.RLQS.Proxies[f.Region] == 0 {
			p.Errorf(f.Line, fmt.Sprintf("faults[%d].%s", i, f.Kind), "region %s has no RLQS proxies (rlqs.proxies_per_region, rlqs.proxies)", f.Region)
		}
	}
}
