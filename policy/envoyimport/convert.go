package envoyimport

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/ration-dev/ration/policy"
)

// Descriptor names the Envoy adapter (lease/agent/envoyrls) sets itself,
// with its default configuration, and that converted rules match.
const (
	// DomainKey carries the request's domain.
	DomainKey = "domain"
	// KeysKey carries the keys of an Envoy descriptor's entries, in order,
	// as AppendKeys writes them: a rule then matches descriptors of
	// exactly its node's depth and order, as Envoy's tree walk does.
	KeysKey = "envoy.keys"
	// LimitKey carries a descriptor's limit override, when it has one
	// ("100/minute"); rules with allow_descriptor_limit match it.
	LimitKey = "envoy.limit"
)

// AppendKeys appends the i-th entry key of an Envoy descriptor to dst, as
// the value of KeysKey is written: keys joined by ",", with '%' and ','
// percent-encoded so that different key lists never give the same value.
func AppendKeys(dst []byte, i int, key string) []byte {
	if i > 0 {
		dst = append(dst, ',')
	}
	for j := 0; j < len(key); j++ {
		switch c := key[j]; c {
		case '%':
			dst = append(dst, "%25"...)
		case ',':
			dst = append(dst, "%2C"...)
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// File is one Envoy rate limit configuration file.
type File struct {
	Name string
	Data []byte
}

// Result is a converted configuration.
type Result struct {
	// Set holds the converted rules, in file and tree order; its Source is
	// the policy document (policy.Format).
	Set *policy.Set
	// Notes name the fields converted with a difference that does not
	// change decisions ("config.yaml:12: descriptors[0].detailed_metric:
	// ..."), for the user to read.
	Notes []string
}

// Convert converts files, each one domain (several files may not share a
// domain), into one rule set. A configuration it cannot convert to the same
// decisions gives Errors, every problem with its file, line and field, and
// no Result.
func Convert(files []File) (*Result, error) {
	var (
		errs    Errors
		notes   []string
		domains []*domain
	)
	first := map[string]*domain{}
	for _, f := range files {
		p := &parser{}
		p.File = f.Name
		p.MaxProblems = policy.MaxProblems
		d := p.document(f.Data)
		if d != nil && d.name != "" {
			if prev, dup := first[d.name]; dup {
				p.Errorf(d.line, "domain", "duplicate domain %q (first in %s:%d)", d.name, prev.file, prev.line)
			} else {
				first[d.name] = d
			}
		}
		if err := p.Err(); err != nil {
			errs = append(errs, err.(Errors)...)
			continue
		}
		notes = append(notes, p.notes...)
		domains = append(domains, d)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	c := &converter{names: map[string]bool{}}
	for _, d := range domains {
		c.domain(d)
	}
	if len(c.errs) > 0 {
		return nil, c.errs
	}
	if len(c.rules) > policy.MaxRules {
		return nil, Errors{{File: files[0].Name, Msg: fmt.Sprintf("%d rules, more than a policy holds (%d)", len(c.rules), policy.MaxRules)}}
	}
	// The converted rules must be a valid policy: Derive parses them.
	set, err := policy.Derive("envoy-import", c.rules)
	if err != nil {
		return nil, fmt.Errorf("%w: the converted policy is invalid: %w", ErrInvalid, err)
	}
	return &Result{Set: set, Notes: notes}, nil
}

// converter turns domains into rules.
type converter struct {
	rules []*policy.Rule
	names map[string]bool
	errs  Errors
}

// step is one level of a node's path: the node and its siblings.
type step struct {
	n        *node
	siblings []*node
}

// built is a rule with the node it came from, for replaces.
type built struct {
	rule *policy.Rule
	n    *node
}

func (c *converter) domain(d *domain) {
	var made []built
	var walk func(path []step, nodes []*node)
	walk = func(path []step, nodes []*node) {
		for _, n := range nodes {
			p := append(slices.Clip(path), step{n: n, siblings: nodes})
			if r := c.rule(d, p); r != nil {
				made = append(made, built{r, n})
			}
			walk(p, n.children)
		}
	}
	walk(nil, d.nodes)
	c.replaces(d, made)
}

// rule converts the last node of path, nil when it has no limit to enforce.
func (c *converter) rule(d *domain, path []step) *policy.Rule {
	n := path[len(path)-1].n
	if n.limit == nil || n.limit.unlimited {
		return nil // Envoy admits the descriptor uncounted: no rule
	}
	for i, s := range path[:len(path)-1] {
		if s.n.key == n.key {
			c.errs = append(c.errs, &FieldError{File: d.file, Line: n.line, Field: n.path + ".key",
				Msg: fmt.Sprintf("cannot be converted: key %q repeats the key of level %d of its path; a ration request holds each descriptor once", n.key, i+1)})
			return nil
		}
	}
	r := &policy.Rule{
		Algorithm: policy.AlgorithmFixedWindow, Limit: n.limit.perUnit, Period: n.limit.period,
		Calendar: n.limit.calendar, Burst: n.limit.perUnit, Cost: 1,
		Scope: policy.ScopeGlobal, OnError: policy.OnErrorLocal, Shadow: n.shadow,
		Line: n.line,
	}
	var keys []byte
	r.Match = append(r.Match, policy.Descriptor{Key: DomainKey, Value: d.name})
	for i, s := range path {
		keys = AppendKeys(keys, i, s.n.key)
		if !s.n.shared {
			r.Key = append(r.Key, s.n.key)
		}
		if err := c.level(d, r, s); err != nil {
			c.errs = append(c.errs, err)
			return nil
		}
	}
	if len(r.Key) == 0 {
		// Every level shares its counter: the keys descriptor, the same
		// for every request the rule applies to, makes one key.
		r.Key = []string{KeysKey}
	}
	if len(keys) > maxValueLen {
		c.errs = append(c.errs, &FieldError{File: d.file, Line: n.line, Field: n.path,
			Msg: fmt.Sprintf("cannot be converted: the keys of its path are %d bytes, more than a match value holds (%d)", len(keys), maxValueLen)})
		return nil
	}
	r.Match = append(r.Match, policy.Descriptor{Key: KeysKey, Value: string(keys)})
	slices.SortFunc(r.Match, func(a, b policy.Descriptor) int { return strings.Compare(a.Key, b.Key) })
	slices.SortFunc(r.MatchPrefix, func(a, b policy.Descriptor) int { return strings.Compare(a.Key, b.Key) })
	slices.SortFunc(r.Except, func(a, b policy.Descriptor) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(a.Value, b.Value))
	})
	r.Name = c.name(d, path)
	c.rules = append(c.rules, r)
	return r
}

// level adds to r the conditions of one level of its path, in the order
// Envoy's tree walk tries the nodes of a level: a node for the entry's
// exact value first, then the wildcard patterns in file order, then the
// node for the key alone. So a pattern's rule excepts the exact values it
// matches and the earlier patterns that overlap it, and a rule for the key
// alone excepts every exact value and pattern of its siblings.
func (c *converter) level(d *domain, r *policy.Rule, s step) *FieldError {
	n := s.n
	switch {
	case n.value != "" && !n.pattern:
		r.Match = append(r.Match, policy.Descriptor{Key: n.key, Value: n.value})
		return nil
	case n.pattern && n.value != "":
		r.MatchPrefix = append(r.MatchPrefix, policy.Descriptor{Key: n.key, Value: n.value})
	}
	before := true // sib comes before n in the file
	for _, sib := range s.siblings {
		switch {
		case sib == n:
			before = false
		case sib.key != n.key:
		case !sib.pattern:
			// An exact value wins wherever it is written.
			if sib.value != "" && strings.HasPrefix(sib.value, n.value) {
				r.Except = append(r.Except, policy.Descriptor{Key: n.key, Value: sib.value})
			}
		case n.pattern && !before:
			// A later pattern comes after n.
		case strings.HasPrefix(n.value, sib.value) && (n.pattern || sib.value == ""):
			return &FieldError{File: d.file, Line: n.line, Field: n.path,
				Msg: fmt.Sprintf("cannot be converted: no request reaches it: the value %q (line %d) matches every value it does, and comes first", sib.value+"*", sib.line)}
		case strings.HasPrefix(sib.value, n.value):
			r.Except = append(r.Except, policy.Descriptor{Key: n.key, Value: sib.value + "*"})
		}
	}
	return nil
}

// name derives a unique rule name from the domain and the path: readable
// when it fits, else cut and made unique by a hash of the whole path.
func (c *converter) name(d *domain, path []step) string {
	parts := []string{sanitize(d.name)}
	if c := parts[0][0]; c == '-' || c == '_' {
		parts[0] = "x" + parts[0] // a name starts with a letter or digit
	}
	id := []string{d.name}
	for _, s := range path {
		part := sanitize(s.n.key)
		v := s.n.value
		if s.n.pattern {
			v += "*"
		}
		if v != "" {
			part += "_" + sanitize(v)
		}
		parts = append(parts, part)
		id = append(id, s.n.key, v)
	}
	name := strings.Join(parts, ".")
	if len(name) > 64 || c.names[name] {
		sum := sha256.Sum256([]byte(strings.Join(id, "\x00")))
		name = strings.TrimRight(name[:min(len(name), 47)], "._-") + "-" + hex.EncodeToString(sum[:8])
	}
	c.names[name] = true
	return name
}

// sanitize maps s into the alphabet of rule names, [a-z0-9_-].
func sanitize(s string) string {
	b := []byte(strings.ToLower(s))
	for i, ch := range b {
		if !('a' <= ch && ch <= 'z' || '0' <= ch && ch <= '9' || ch == '_' || ch == '-') {
			b[i] = '-'
		}
	}
	return string(b)
}

// replaces turns each limit's replaces (Envoy limit names, within the
// domain) into the names of the rules of the limits so named.
func (c *converter) replaces(d *domain, made []built) {
	byName := map[string][]string{}
	unlimited := map[string]bool{}
	var visit func([]*node)
	visit = func(ns []*node) {
		for _, n := range ns {
			if n.limit != nil && n.limit.name != "" && n.limit.unlimited {
				unlimited[n.limit.name] = true
			}
			visit(n.children)
		}
	}
	visit(d.nodes)
	for _, b := range made {
		if b.n.limit.name != "" {
			byName[b.n.limit.name] = append(byName[b.n.limit.name], b.rule.Name)
		}
	}
	for _, b := range made {
		for _, ref := range b.n.limit.replaces {
			rules, ok := byName[ref.name]
			switch {
			case ok:
				for _, r := range rules {
					if r != b.rule.Name && !slices.Contains(b.rule.Replaces, r) {
						b.rule.Replaces = append(b.rule.Replaces, r)
					}
				}
			case unlimited[ref.name]:
				// Replacing an unlimited limit changes nothing: it counts nothing.
			default:
				c.errs = append(c.errs, &FieldError{File: d.file, Line: ref.line, Field: ref.field,
					Msg: fmt.Sprintf("no rate_limit in domain %q is named %q", d.name, ref.name)})
			}
		}
	}
}
