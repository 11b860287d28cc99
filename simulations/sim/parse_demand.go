package sim

import (
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/internal/yamlfield"
)

func (p *parser) demand(f yamlfield.Field, sc *Scenario) []DemandStep {
	var out []DemandStep
	for i, n := range p.nonEmptyList(f, "demand", "") {
		path := fmt.Sprintf("demand[%d]", i)
		st, ok := p.demandStep(n, path, sc)
		if !ok {
			continue
		}
		if i == 0 && st.At != 0 {
			p.Errorf(n.Line, path+".at", "the first demand step must be at 0s")
		}
		// The previous step is the last one decoded: a step that is not a
		// mapping has been reported and left out.
		if i > 0 && len(out) > 0 && st.At <= out[len(out)-1].At {
			p.Errorf(n.Line, path+".at", "must be after the previous step's (%v)", out[len(out)-1].At)
		}
		out = append(out, st)
	}
	return out
}

// demandStep decodes one demand step. It returns ok=false only when n is
// not a mapping.
func (p *parser) demandStep(n *yaml.Node, path string, sc *Scenario) (DemandStep, bool) {
	fs, ok := p.mapping(n, path, "at", "ramp", "rates", "every", "alt_rates")
	if !ok {
		return DemandStep{}, false
	}
	st := DemandStep{Line: n.Line}
	if f, ok := p.required(fs, path, "at"); ok {
		st.At, _ = p.duration(f, path+".at")
	}
	if f, ok := fs.Get("ramp"); ok {
		st.Ramp, _ = p.duration(f, path+".ramp")
	}
	if f, ok := p.required(fs, path, "rates"); ok {
		st.Rates = p.rates(path+".rates", f.Val, sc)
	}
	p.alternation(fs, path, sc, &st)
	return st, true
}

// alternation decodes every and alt_rates, which go together.
func (p *parser) alternation(fs fields, path string, sc *Scenario, st *DemandStep) {
	every, hasEvery := fs.Get("every")
	alt, hasAlt := fs.Get("alt_rates")
	switch {
	case hasEvery && hasAlt:
		if d, ok := p.duration(every, path+".every"); ok && d < sc.Step {
			p.Errorf(every.Key.Line, path+".every", "must be at least step (%v)", sc.Step)
		} else {
			st.Every = d
		}
		st.AltRates = p.rates(path+".alt_rates", alt.Val, sc)
	case hasEvery:
		p.Errorf(every.Key.Line, path+".every", "needs alt_rates")
	case hasAlt:
		p.Errorf(alt.Key.Line, path+".alt_rates", "needs every")
	}
}

// rates decodes requests per second by region name.
func (p *parser) rates(path string, v *yaml.Node, sc *Scenario) map[string]float64 {
	fs, ok := p.mapping(v, path, sc.Regions...)
	if !ok {
		return nil
	}
	out := map[string]float64{}
	for _, r := range sc.Regions {
		if f, ok := fs.Get(r); ok {
			if x, ok := p.Number(f, path+"."+r); ok {
				if x < 0 || x > 1e8 {
					p.Errorf(f.Key.Line, path+"."+r, "must be in [0, 1e8] requests/s")
				}
				out[r] = x
			}
		}
	}
	return out
}
