package sim

import (
	"errors"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/policy"
)

// ruleFields are the key group fields the policy package decodes: a key
// group's algorithm, period and time zone mean what they mean in a rule,
// and are refused where a rule would be. burst goes too for a fixed window,
// which has none.
var ruleFields = []string{"algorithm", "period", "time_zone"}

// groupAlgorithm decodes a key group's algorithm, period and time_zone by
// parsing them as a one-rule policy with the policy package, and records
// the policy's problems at the key group's own fields and lines.
func (p *parser) groupAlgorithm(fs fields, path string, g *KeyGroup) {
	names := ruleFields
	if f, ok := fs.Get("algorithm"); ok && f.Val.Kind == yaml.ScalarNode && f.Val.Value == FixedWindow {
		// Even when the policy refuses another of the fields: the group's
		// other fields are checked as a fixed window's.
		g.RuleAlgorithm = FixedWindow
		names = append(names[:len(names):len(names)], "burst")
	}
	doc, given := ruleDocument(fs, names)
	if !given {
		return // a token bucket of one second: the defaults
	}
	set, err := policy.Parse("key group", doc)
	if err != nil {
		p.policyErrors(fs, path, err)
		return
	}
	r := set.Rule("k")
	g.RuleAlgorithm, g.Period, g.Calendar = string(r.Algorithm), r.Period, r.Calendar
	if f, ok := fs.Get("time_zone"); ok {
		g.TimeZone = f.Val.Value
	}
}

// ruleDocument writes a policy of one rule holding the group's fields
// named (those it has), with placeholders for the rest of a valid rule;
// given is false when the group has none of them.
func ruleDocument(fs fields, names []string) (doc []byte, given bool) {
	rule := &yaml.Node{Kind: yaml.MappingNode}
	add := func(k string, v *yaml.Node) {
		rule.Content = append(rule.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, v)
	}
	add("name", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "k"})
	add("key", &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle,
		Content: []*yaml.Node{{Kind: yaml.ScalarNode, Tag: "!!str", Value: "k"}}})
	add("limit", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: "1"})
	for _, name := range names {
		if f, ok := fs.Get(name); ok {
			add(name, copyValue(f.Val))
			given = true
		}
	}
	root := &yaml.Node{Kind: yaml.MappingNode}
	root.Content = []*yaml.Node{{Kind: yaml.ScalarNode, Tag: "!!str", Value: "rules"},
		{Kind: yaml.SequenceNode, Content: []*yaml.Node{rule}}}
	out, err := yaml.Marshal(root)
	if err != nil {
		// Only scalars and empty collections are copied, which always
		// encode; a failure would be a bug in this function.
		panic("sim: encoding a key group's rule: " + err.Error())
	}
	return out, given
}

// copyValue copies a field's value for the rule document: a scalar with
// its resolved tag, so that it means to the policy what it meant in the
// scenario ("60" quoted stays a string, 60 an integer); a mapping or list
// as an empty one, which the policy describes the same way.
func copyValue(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.ScalarNode {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: n.ShortTag(), Value: n.Value, Style: n.Style &^ (yaml.TaggedStyle | yaml.FlowStyle)}
	}
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		return &yaml.Node{Kind: n.Kind, Style: yaml.FlowStyle}
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
}

// policyErrors records the policy's problems with the rule document at the
// key group's fields: "rules[0].period" is path.period, at its line.
func (p *parser) policyErrors(fs fields, path string, err error) {
	var es policy.Errors
	if !errors.As(err, &es) {
		p.Errorf(fs.line, path, "%v", err)
		return
	}
	for _, e := range es {
		name, ok := strings.CutPrefix(e.Field, "rules[0].")
		if f, known := fs.Get(name); ok && known {
			p.Errorf(f.Key.Line, path+"."+name, "%s", e.Msg)
		} else {
			// A problem of the placeholders: a bug, but say what it is.
			p.Errorf(fs.line, path, "%s: %s", e.Field, e.Msg)
		}
	}
}
