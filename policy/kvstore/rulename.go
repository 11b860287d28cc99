package kvstore

import (
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ruleNamer returns a function that gives, best effort, the name the
// document gives the rule a field path like "rules[2].limit" is in: "" when
// the path is not a rule's or the document does not name it (or does not
// parse). The document is parsed once, at the first call.
func ruleNamer(doc []byte) func(field string) string {
	var rules *yaml.Node
	parsed := false
	return func(field string) string {
		if !parsed {
			parsed = true
			var root yaml.Node
			if yaml.Unmarshal(doc, &root) == nil && len(root.Content) > 0 {
				rules = mapValue(root.Content[0], "rules")
			}
		}
		return ruleName(rules, field)
	}
}

func ruleName(rules *yaml.Node, field string) string {
	rest, ok := strings.CutPrefix(field, "rules[")
	if !ok {
		return ""
	}
	end := strings.IndexByte(rest, ']')
	if end < 0 {
		return ""
	}
	i, err := strconv.Atoi(rest[:end])
	if err != nil || i < 0 {
		return ""
	}
	if rules == nil || rules.Kind != yaml.SequenceNode || i >= len(rules.Content) {
		return ""
	}
	name := mapValue(rules.Content[i], "name")
	if name == nil || name.Kind != yaml.ScalarNode {
		return ""
	}
	return name.Value
}

// mapValue is the value of key in mapping n, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for j := 0; j+1 < len(n.Content); j += 2 {
		if n.Content[j].Value == key {
			return n.Content[j+1]
		}
	}
	return nil
}
