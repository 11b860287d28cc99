package yamlfield

import (
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Field is one key/value entry of a YAML mapping.
type Field struct {
	Name     string
	Key, Val *yaml.Node
}

// Item makes a list element a Field, so that the scalar decoders can read
// it: problems are reported at the element's line.
func Item(n *yaml.Node) Field { return Field{Key: n, Val: n} }

// Fields is a mapping's accepted entries in document order, without
// duplicates.
type Fields []Field

// Get returns the entry named name.
func (fs Fields) Get(name string) (Field, bool) {
	for _, f := range fs {
		if f.Name == name {
			return f, true
		}
	}
	return Field{}, false
}

// Fields checks the keys of mapping m, whose path is path: strings,
// unique, and one of known (none, when known is empty). Entries with a bad
// key, and values that are aliases, are recorded as problems and left out.
func (c *Checker[S]) Fields(m *yaml.Node, path string, known ...string) Fields {
	return c.fields(m, path, known, false)
}

// AnyFields is Fields for a mapping whose keys may be any strings.
func (c *Checker[S]) AnyFields(m *yaml.Node, path string) Fields {
	return c.fields(m, path, nil, true)
}

func (c *Checker[S]) fields(m *yaml.Node, path string, known []string, anyName bool) Fields {
	var out Fields
	seen := make(map[string]int, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			c.Errorf(k.Line, path, "merge keys (<<) are not supported")
			continue
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			c.Errorf(k.Line, path, "keys must be strings (got %s)", Describe(k))
			continue
		}
		name := k.Value
		fieldPath := Join(path, name)
		if first, dup := seen[name]; dup {
			c.Errorf(k.Line, fieldPath, "duplicate key (first at line %d)", first)
			continue
		}
		seen[name] = k.Line
		if !anyName && !slices.Contains(known, name) {
			c.Errorf(k.Line, fieldPath, "unknown field (known: %s)", strings.Join(known, ", "))
			continue
		}
		if v.Kind == yaml.AliasNode {
			c.Errorf(v.Line, fieldPath, "aliases are not supported")
			continue
		}
		out = append(out, Field{Name: name, Key: k, Val: v})
	}
	return out
}

// Join appends the mapping key name to the field path path (which may be
// empty), quoting the key unless it is a plain name, so that a key holding
// spaces or newlines cannot garble a message.
func Join(path, name string) string {
	elem := name
	if !plain(name) {
		elem = strconv.Quote(Clip(name))
	}
	if path == "" {
		return elem
	}
	return path + "." + elem
}

// plain reports whether s is 1 to 128 bytes of [A-Za-z0-9_.:/-].
func plain(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("_.:/-", r))
	})
}
