package policy

import (
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/internal/yamlfield"
)

// MaxExcept bounds a rule's except values: Applies scans them all.
const MaxExcept = 1024

// replaceRef is one entry of a rule's replaces, kept with its line until
// every rule name of the document is known.
type replaceRef struct {
	rule  *Rule
	name  string
	line  int
	field string
}

// ruleEnvoy decodes a rule's match_prefix, except, replaces and
// allow_descriptor_limit:
// the fields that let a rule express an Envoy rate limit configuration
// (policy/envoyimport) and Envoy's per-descriptor limit override.
func (p *parser) ruleEnvoy(fs yamlfield.Fields, path string, r *Rule) {
	if f, ok := fs.Get("match_prefix"); ok {
		r.MatchPrefix = p.matchPrefix(f, path+".match_prefix")
	}
	if f, ok := fs.Get("except"); ok {
		r.Except = p.except(f, path+".except")
	}
	if f, ok := fs.Get("replaces"); ok {
		r.Replaces = p.replaceNames(f, path+".replaces", r)
	}
	if f, ok := fs.Get("allow_descriptor_limit"); ok {
		r.AllowDescriptorLimit, _ = p.Bool(f, path+".allow_descriptor_limit")
	}
}

// except decodes a mapping of descriptor names to non-empty lists of values.
func (p *parser) except(f yamlfield.Field, path string) []Descriptor {
	if f.Val.Kind != yaml.MappingNode {
		p.Errorf(f.Key.Line, path, "must be a mapping of descriptor names to lists of values (got %s)", yamlfield.Describe(f.Val))
		return nil
	}
	var out []Descriptor
	for _, e := range p.AnyFields(f.Val, path) {
		field := yamlfield.Join(path, e.Name)
		if !p.descriptorName(e.Key.Line, field, e.Name) {
			continue
		}
		if e.Val.Kind != yaml.SequenceNode || len(e.Val.Content) == 0 {
			p.Errorf(e.Key.Line, field, "must be a non-empty list of values (got %s)", yamlfield.Describe(e.Val))
			continue
		}
		for i, n := range e.Val.Content {
			vf := field + "[" + strconv.Itoa(i) + "]"
			switch {
			case n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str":
				p.Errorf(n.Line, vf, "must be a string (got %s); quote it", yamlfield.Describe(n))
			case n.Value == "" || n.Value == Wildcard:
				p.Errorf(n.Line, vf, "must be a value or a prefix ending in %q, not empty or %q alone", Wildcard, Wildcard)
			case len(n.Value) > maxMatchValueLen:
				p.Errorf(n.Line, vf, "must be at most %d bytes (got %d)", maxMatchValueLen, len(n.Value))
			default:
				out = append(out, Descriptor{Key: e.Name, Value: n.Value})
			}
		}
	}
	if len(out) > MaxExcept {
		p.Errorf(f.Key.Line, path, "has %d values; the limit is %d", len(out), MaxExcept)
		return nil
	}
	slices.SortFunc(out, func(a, b Descriptor) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return strings.Compare(a.Value, b.Value)
	})
	return slices.Compact(out)
}

// matchPrefix decodes a mapping of descriptor names to non-empty prefixes.
func (p *parser) matchPrefix(f yamlfield.Field, path string) []Descriptor {
	if f.Val.Kind != yaml.MappingNode {
		p.Errorf(f.Key.Line, path, "must be a mapping of descriptor names to prefixes (got %s)", yamlfield.Describe(f.Val))
		return nil
	}
	fs := p.AnyFields(f.Val, path)
	if len(fs) > MaxDescriptors {
		p.Errorf(f.Key.Line, path, "has %d descriptors; the limit is %d", len(fs), MaxDescriptors)
		return nil
	}
	var out []Descriptor
	for _, e := range fs {
		field := yamlfield.Join(path, e.Name)
		if !p.descriptorName(e.Key.Line, field, e.Name) {
			continue
		}
		switch v := e.Val; {
		case v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str":
			p.Errorf(e.Key.Line, field, "must be a string (got %s); quote it", yamlfield.Describe(v))
		case v.Value == "":
			p.Errorf(e.Key.Line, field, "must not be empty (a key name requires the descriptor with any value)")
		case len(v.Value) > maxMatchValueLen:
			p.Errorf(e.Key.Line, field, "must be at most %d bytes (got %d)", maxMatchValueLen, len(v.Value))
		default:
			out = append(out, Descriptor{Key: e.Name, Value: v.Value})
		}
	}
	slices.SortFunc(out, func(a, b Descriptor) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// replaceNames decodes a list of rule names; rules checks that they exist.
func (p *parser) replaceNames(f yamlfield.Field, path string, r *Rule) []string {
	items := p.nonEmptyList(f, path, "rule names", "names", MaxRules)
	out := make([]string, 0, len(items))
	for i, n := range items {
		field := path + "[" + strconv.Itoa(i) + "]"
		switch {
		case n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" || !validName(n.Value) || len(n.Value) > maxNameLen:
			p.Errorf(n.Line, field, "must be a rule name (got %s)", yamlfield.Describe(n))
		case slices.Contains(out, n.Value):
			p.Errorf(n.Line, field, "duplicate rule name %q", n.Value)
		default:
			out = append(out, n.Value)
			p.refs = append(p.refs, replaceRef{rule: r, name: n.Value, line: n.Line, field: field})
		}
	}
	return out
}

// replaces checks every replaces entry against the document's rule names.
func (p *parser) replaces(names map[string]int) {
	for _, ref := range p.refs {
		switch _, ok := names[ref.name]; {
		case ref.name == ref.rule.Name:
			p.Errorf(ref.line, ref.field, "a rule cannot replace itself")
		case !ok:
			p.Errorf(ref.line, ref.field, "no rule is named %q", ref.name)
		}
	}
}
