package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// field is one key/value entry of a YAML mapping.
type field struct {
	name     string
	key, val *yaml.Node
}

// fieldSet is a mapping's entries in document order, without duplicates.
type fieldSet []field

func (fs fieldSet) get(name string) (field, bool) {
	for _, f := range fs {
		if f.name == name {
			return f, true
		}
	}
	return field{}, false
}

// fields checks the keys of mapping m: strings, unique, and one of known
// (any name when known is empty). Entries with a bad key, and values that
// are aliases, are reported and left out.
func (p *parser) fields(m *yaml.Node, path string, known ...string) fieldSet {
	var out fieldSet
	seen := make(map[string]int, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			p.errorf(k.Line, path, "merge keys (<<) are not supported")
			continue
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			p.errorf(k.Line, path, "keys must be strings (got %s)", describe(k))
			continue
		}
		name := k.Value
		fieldPath := pathElem(name)
		if path != "" {
			fieldPath = path + "." + fieldPath
		}
		if first, dup := seen[name]; dup {
			p.errorf(k.Line, fieldPath, "duplicate key (first at line %d)", first)
			continue
		}
		seen[name] = k.Line
		if len(known) > 0 && !slices.Contains(known, name) {
			p.errorf(k.Line, fieldPath, "unknown field (known: %s)", strings.Join(known, ", "))
			continue
		}
		if v.Kind == yaml.AliasNode {
			p.errorf(v.Line, fieldPath, "aliases are not supported")
			continue
		}
		out = append(out, field{name: name, key: k, val: v})
	}
	return out
}

// pathElem renders a mapping key in a field path, quoted unless it is a
// plain name, so a key holding spaces or newlines cannot garble a message.
func pathElem(name string) string {
	if len(name) > 0 && len(name) <= maxDescriptorNameLen && validDescriptorName(name) {
		return name
	}
	return strconv.Quote(clip(name))
}

func (p *parser) str(f field, path string) (string, bool) {
	if f.val.Kind != yaml.ScalarNode || f.val.ShortTag() != "!!str" {
		p.errorf(f.key.Line, path, "must be a string (got %s)", describe(f.val))
		return "", false
	}
	return f.val.Value, true
}

func (p *parser) enum(f field, path string, allowed ...string) (string, bool) {
	n := f.val
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && slices.Contains(allowed, n.Value) {
		return n.Value, true
	}
	quoted := make([]string, len(allowed))
	for i, a := range allowed {
		quoted[i] = strconv.Quote(a)
	}
	p.errorf(f.key.Line, path, "must be one of %s (got %s)", strings.Join(quoted, ", "), describe(n))
	return "", false
}

func (p *parser) boolean(f field, path string) (bool, bool) {
	var b bool
	if f.val.Kind == yaml.ScalarNode && f.val.ShortTag() == "!!bool" && f.val.Decode(&b) == nil {
		return b, true
	}
	p.errorf(f.key.Line, path, "must be true or false (got %s)", describe(f.val))
	return false, false
}

// tokens decodes a token count: an integer in [1, MaxTokens].
func (p *parser) tokens(f field, path string) (int64, bool) {
	n := f.val
	var v int64
	switch {
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int":
		if err := n.Decode(&v); err != nil {
			p.errorf(f.key.Line, path, "must be an integer that fits in int64 (got %s)", clip(n.Value))
			return 0, false
		}
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" && isInteger(n.Value):
		// yaml.v3 resolves integers beyond uint64 as floats.
		p.errorf(f.key.Line, path, "must be an integer that fits in int64 (got %s)", clip(n.Value))
		return 0, false
	default:
		p.errorf(f.key.Line, path, "must be an integer (got %s)", describe(n))
		return 0, false
	}
	switch {
	case v <= 0:
		p.errorf(f.key.Line, path, "must be > 0")
		return 0, false
	case v > MaxTokens:
		p.errorf(f.key.Line, path, "must be at most %d (2^53)", int64(MaxTokens))
		return 0, false
	}
	return v, true
}

func isInteger(s string) bool {
	s = strings.TrimLeft(s, "+-")
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// duration decodes a Go duration string of at most MaxPeriod. A bare 0 is
// accepted as zero; other bare numbers are errors, since their unit would
// be a guess.
func (p *parser) duration(f field, path string) (time.Duration, bool) {
	n := f.val
	var d time.Duration
	switch {
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int" && n.Value == "0":
		return 0, true
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str":
		var err error
		if d, err = time.ParseDuration(n.Value); err != nil {
			p.errorf(f.key.Line, path, `must be a Go duration such as "1s" or "500ms" (got %q)`, clip(n.Value))
			return 0, false
		}
	case n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float"):
		p.errorf(f.key.Line, path, `must be a Go duration with a unit, such as "1s" or "500ms" (got %s)`, describe(n))
		return 0, false
	default:
		p.errorf(f.key.Line, path, `must be a Go duration such as "1s" or "500ms" (got %s)`, describe(n))
		return 0, false
	}
	if d > MaxPeriod {
		p.errorf(f.key.Line, path, "must be at most %s", "24h")
		return 0, false
	}
	return d, true
}

// describe names a node's kind and value for messages: `string "x"`,
// "integer 5", "a list".
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.AliasNode:
		return "an alias; aliases are not supported"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch tag := n.ShortTag(); tag {
		case "!!str":
			return fmt.Sprintf("string %q", clip(n.Value))
		case "!!int":
			return "integer " + clip(n.Value)
		case "!!float":
			return "number " + clip(n.Value)
		case "!!bool":
			return "boolean " + n.Value
		case "!!null":
			return "null"
		default:
			return fmt.Sprintf("a value tagged %s", clip(tag))
		}
	}
	return "an unexpected YAML node"
}

// clip shortens a value quoted in a message, so one huge scalar cannot make
// a huge error.
func clip(s string) string {
	const max = 40
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && s[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return s[:cut] + "…"
}
