package yamlfield

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// The decoders read f.Val and record a problem at f.Key's line, in field
// path, when it is not what they decode; ok is false then.

// Str decodes a YAML string.
func (c *Checker[S]) Str(f Field, path string) (s string, ok bool) {
	if f.Val.Kind != yaml.ScalarNode || f.Val.ShortTag() != "!!str" {
		c.Errorf(f.Key.Line, path, "must be a string (got %s)", Describe(f.Val))
		return "", false
	}
	return f.Val.Value, true
}

// Enum decodes a YAML string that is one of allowed.
func (c *Checker[S]) Enum(f Field, path string, allowed ...string) (string, bool) {
	n := f.Val
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && slices.Contains(allowed, n.Value) {
		return n.Value, true
	}
	quoted := make([]string, len(allowed))
	for i, a := range allowed {
		quoted[i] = strconv.Quote(a)
	}
	c.Errorf(f.Key.Line, path, "must be one of %s (got %s)", strings.Join(quoted, ", "), Describe(n))
	return "", false
}

// Bool decodes a YAML boolean.
func (c *Checker[S]) Bool(f Field, path string) (v, ok bool) {
	var b bool
	if f.Val.Kind == yaml.ScalarNode && f.Val.ShortTag() == "!!bool" && f.Val.Decode(&b) == nil {
		return b, true
	}
	c.Errorf(f.Key.Line, path, "must be true or false (got %s)", Describe(f.Val))
	return false, false
}

// Int decodes a YAML integer that fits in int64.
func (c *Checker[S]) Int(f Field, path string) (int64, bool) {
	n := f.Val
	var v int64
	switch {
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int":
		if err := n.Decode(&v); err == nil {
			return v, true
		}
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" && isInteger(n.Value):
		// yaml.v3 resolves integers beyond uint64 as floats.
	default:
		c.Errorf(f.Key.Line, path, "must be an integer (got %s)", Describe(n))
		return 0, false
	}
	c.Errorf(f.Key.Line, path, "must be an integer that fits in int64 (got %s)", Clip(n.Value))
	return 0, false
}

func isInteger(s string) bool {
	s = strings.TrimLeft(s, "+-")
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// Number decodes a finite YAML integer or float.
func (c *Checker[S]) Number(f Field, path string) (float64, bool) {
	v := f.Val
	if v.Kind == yaml.ScalarNode && (v.ShortTag() == "!!int" || v.ShortTag() == "!!float") {
		if x, err := strconv.ParseFloat(strings.ReplaceAll(v.Value, "_", ""), 64); err == nil && !math.IsInf(x, 0) && !math.IsNaN(x) {
			return x, true
		}
	}
	c.Errorf(f.Key.Line, path, "must be a number (got %s)", Describe(v))
	return 0, false
}

// Duration decodes a duration as ParseDuration does, with problems that
// say what a duration looks like.
func (c *Checker[S]) Duration(f Field, path string) (time.Duration, bool) {
	n := f.Val
	if d, ok := ParseDuration(n); ok {
		return d, true
	}
	switch {
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str":
		c.Errorf(f.Key.Line, path, `must be a Go duration such as "1s" or "500ms" (got %q)`, Clip(n.Value))
	case n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float"):
		c.Errorf(f.Key.Line, path, `must be a Go duration with a unit, such as "1s" or "500ms" (got %s)`, Describe(n))
	default:
		c.Errorf(f.Key.Line, path, `must be a Go duration such as "1s" or "500ms" (got %s)`, Describe(n))
	}
	return 0, false
}

// ParseDuration decodes a Go duration string ("1s", "250ms", "-1m"). A
// bare 0 is zero; other bare numbers are not durations, since their unit
// would be a guess.
func ParseDuration(n *yaml.Node) (time.Duration, bool) {
	switch {
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int" && n.Value == "0":
		return 0, true
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str":
		d, err := time.ParseDuration(n.Value)
		return d, err == nil
	}
	return 0, false
}

// Describe names a node's kind and value for messages: `string "x"`,
// "integer 5", "a list".
func Describe(n *yaml.Node) string {
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
			return fmt.Sprintf("string %q", Clip(n.Value))
		case "!!int":
			return "integer " + bare(Clip(n.Value))
		case "!!float":
			return "number " + bare(Clip(n.Value))
		case "!!bool":
			return "boolean " + bare(Clip(n.Value))
		case "!!null":
			return "null"
		default:
			return "a value tagged " + bare(Clip(tag))
		}
	}
	return "an unexpected YAML node"
}

// bare returns s as it is, or quoted if it holds a control character (an
// explicit tag can put anything there, a line break too), so that a
// message stays on one line.
func bare(s string) string {
	if strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}

// Clip shortens a value quoted in a message to 40 bytes and an ellipsis,
// so one huge scalar cannot make a huge error.
func Clip(s string) string {
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
