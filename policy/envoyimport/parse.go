package envoyimport

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/internal/yamlfield"
	"github.com/ration-dev/ration/policy"
)

// ErrInvalid is wrapped by every error Convert returns for a configuration
// it cannot convert: errors.Is(err, envoyimport.ErrInvalid).
var ErrInvalid = errors.New("envoyimport: cannot convert")

// FieldError is one problem: "config.yaml:12: descriptors[0].value: ...".
type FieldError = yamlfield.Error[invalid]

// Errors is every problem found, sorted by file then line.
type Errors = yamlfield.Errors[invalid]

type invalid struct{}

func (invalid) Sentinel() error { return ErrInvalid }

// maxDepth bounds a descriptor tree's depth: ration rules hold at most
// policy.MaxDescriptors descriptors, of which two are the domain and keys.
const maxDepth = policy.MaxDescriptors - 2

// domain is one file's configuration.
type domain struct {
	name  string
	file  string
	line  int
	nodes []*node
}

// node is one entry of a descriptors list.
type node struct {
	key, value string // value "" matches any value
	// pattern: value is the prefix of a trailing-* wildcard ("" for "*").
	pattern bool
	// shared: share_threshold, one counter for every value of the pattern.
	shared   bool
	line     int
	path     string // field path, for messages
	limit    *limit // nil: no rate_limit
	shadow   bool
	children []*node
}

// limit is a node's rate_limit.
type limit struct {
	line      int
	unlimited bool
	perUnit   int64
	period    time.Duration
	calendar  policy.Calendar
	name      string
	replaces  []ref
}

// ref is one replaces entry.
type ref struct {
	name, field string
	line        int
}

// parser reads one file into a domain.
type parser struct {
	yamlfield.Checker[invalid]
	notes []string
}

func (p *parser) note(line int, field, msg string) {
	p.notes = append(p.notes, (&FieldError{File: p.File, Line: line, Field: field, Msg: msg}).Error())
}

func (p *parser) document(data []byte) *domain {
	if len(data) > policy.MaxDocumentSize {
		p.Errorf(0, "", "file is larger than %d bytes", policy.MaxDocumentSize)
		return nil
	}
	root := p.Root(data, yamlfield.Document{Empty: "file is empty; want a mapping with domain and descriptors", Single: true, SyntaxLine: true})
	if root == nil {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		p.Errorf(root.Line, "", "must be a mapping with domain and descriptors (got %s)", yamlfield.Describe(root))
		return nil
	}
	fs := p.Fields(root, "", "domain", "descriptors")
	d := &domain{file: p.File, line: root.Line}
	if f, ok := fs.Get("domain"); !ok {
		p.Errorf(root.Line, "domain", "is required")
	} else if s, ok := p.text(f, "domain"); !ok || s == "" || len(s) > maxValueLen {
		if ok || f.Val.Kind == yaml.ScalarNode {
			p.Errorf(f.Key.Line, "domain", "must be 1 to %d bytes", maxValueLen)
		}
	} else {
		d.name, d.line = s, f.Key.Line
	}
	if f, ok := fs.Get("descriptors"); ok {
		d.nodes = p.descriptors(f, "descriptors", 1)
	}
	return d
}

// maxValueLen is the longest match value a policy accepts.
const maxValueLen = 1024

// reserved are the descriptor names the Envoy adapter sets itself.
var reserved = []string{DomainKey, KeysKey, LimitKey}

var nodeFields = []string{
	"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric",
	"value_to_metric", "quota_mode", "share_threshold", "metadata",
}

func (p *parser) descriptors(f yamlfield.Field, path string, depth int) []*node {
	seq := f.Val
	if seq.Kind == yaml.ScalarNode && seq.ShortTag() == "!!null" {
		return nil // "descriptors:" with nothing: an empty list, as Envoy reads it
	}
	if seq.Kind != yaml.SequenceNode {
		p.Errorf(f.Key.Line, path, "must be a list of descriptors (got %s)", yamlfield.Describe(seq))
		return nil
	}
	if depth > maxDepth && len(seq.Content) > 0 {
		p.Errorf(f.Key.Line, path, "descriptors nest deeper than %d levels", maxDepth)
		return nil
	}
	var out []*node
	seen := map[[2]string]int{}
	for i, n := range seq.Content {
		np := path + "[" + strconv.Itoa(i) + "]"
		nd := p.node(n, np, depth)
		if nd == nil {
			continue
		}
		id := [2]string{nd.key, nd.value}
		if nd.pattern {
			id[1] += "*"
		}
		if first, dup := seen[id]; dup {
			what := fmt.Sprintf("value %q", id[1])
			if id[1] == "" {
				what = "no value"
			}
			p.Errorf(nd.line, np, "duplicate descriptor: key %q with %s (first at line %d)", nd.key, what, first)
			continue
		}
		seen[id] = nd.line
		out = append(out, nd)
	}
	return out
}

func (p *parser) node(n *yaml.Node, path string, depth int) *node {
	if n.Kind != yaml.MappingNode {
		p.Errorf(n.Line, path, "must be a mapping (got %s)", yamlfield.Describe(n))
		return nil
	}
	fs := p.Fields(n, path, nodeFields...)
	nd := &node{line: n.Line, path: path}
	if f, ok := fs.Get("key"); !ok {
		p.Errorf(n.Line, path+".key", "is required")
		return nil
	} else if s, ok := p.text(f, path+".key"); ok {
		p.key(f, path+".key", s)
		nd.key = s
	} else if f.Val.Kind == yaml.ScalarNode {
		p.Errorf(f.Key.Line, path+".key", "must not be empty")
	}
	if f, ok := fs.Get("value"); ok {
		if s, ok := p.text(f, path+".value"); ok {
			p.value(f, path+".value", s)
			nd.value = s
		}
	}
	if p, ok := strings.CutSuffix(nd.value, "*"); ok {
		nd.value, nd.pattern = p, true
	}
	for _, name := range []string{"shadow_mode", "detailed_metric", "value_to_metric", "quota_mode", "share_threshold"} {
		f, ok := fs.Get(name)
		if !ok {
			continue
		}
		v, ok := p.Bool(f, path+"."+name)
		if !ok || !v {
			continue
		}
		field := path + "." + name
		switch name {
		case "shadow_mode":
			nd.shadow = true
		case "detailed_metric", "value_to_metric":
			p.note(f.Key.Line, field, "changes only Envoy's metric names; ration counts decisions per rule (this node's own rule), not per value")
		case "quota_mode":
			p.Errorf(f.Key.Line, field, "cannot be converted: ration has no quota mode (a request denied only by quota descriptors is still denied)")
		case "share_threshold":
			if !nd.pattern {
				p.Errorf(f.Key.Line, field, "needs a wildcard value ending in *")
			}
			nd.shared = true
		}
	}
	if f, ok := fs.Get("metadata"); ok {
		p.Errorf(f.Key.Line, path+".metadata", "cannot be converted: the Envoy adapter returns no descriptor metadata")
	}
	if f, ok := fs.Get("rate_limit"); ok {
		nd.limit = p.rateLimit(f, path+".rate_limit")
	}
	if nd.shadow && (nd.limit == nil || nd.limit.unlimited) {
		f, _ := fs.Get("shadow_mode")
		p.note(f.Key.Line, path+".shadow_mode", "has no effect without a rate limit to enforce")
	}
	if f, ok := fs.Get("descriptors"); ok {
		nd.children = p.descriptors(f, path+".descriptors", depth+1)
	}
	return nd
}

// text reads a scalar as Envoy does (into a Go string): any scalar's text,
// so value: 123 is "123". Null is absent.
func (p *parser) text(f yamlfield.Field, path string) (string, bool) {
	v := f.Val
	if v.Kind != yaml.ScalarNode {
		p.Errorf(f.Key.Line, path, "must be a string (got %s)", yamlfield.Describe(v))
		return "", false
	}
	if v.ShortTag() == "!!null" {
		return "", false
	}
	return v.Value, true
}

func (p *parser) key(f yamlfield.Field, path, s string) {
	switch {
	case s == "":
		p.Errorf(f.Key.Line, path, "must not be empty")
	case len(s) > 128 || strings.ContainsFunc(s, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("_.:/-", r))
	}):
		p.Errorf(f.Key.Line, path, "cannot be converted: ration descriptor names are 1 to 128 characters of [A-Za-z0-9_.:/-] (got %q)", yamlfield.Clip(s))
	default:
		for _, r := range reserved {
			if s == r {
				p.Errorf(f.Key.Line, path, "cannot be converted: the Envoy adapter sets descriptor %q itself", s)
			}
		}
	}
}

func (p *parser) value(f yamlfield.Field, path, s string) {
	switch {
	case len(s) > maxValueLen:
		p.Errorf(f.Key.Line, path, "must be at most %d bytes (got %d)", maxValueLen, len(s))
	case strings.Contains(strings.TrimSuffix(s, "*"), "*"):
		p.Errorf(f.Key.Line, path, "cannot be converted: wildcard pattern %q; ration matches a prefix (a value ending in *), not a * within a value", yamlfield.Clip(s))
	}
}

var limitFields = []string{"requests_per_unit", "unit", "unlimited", "name", "replaces"}

// units are Envoy's units whose windows ration cuts the same way: Envoy
// counts in windows of Unix time divided by the unit, which are UTC
// seconds, minutes, hours and days; its weeks start on a Thursday (the
// epoch's weekday) and its months are 30 days, which no ration window is.
var units = map[string]time.Duration{
	"SECOND": time.Second, "MINUTE": time.Minute, "HOUR": time.Hour, "DAY": policy.NominalDay,
}

func (p *parser) rateLimit(f yamlfield.Field, path string) *limit {
	if f.Val.Kind != yaml.MappingNode {
		p.Errorf(f.Key.Line, path, "must be a mapping (got %s)", yamlfield.Describe(f.Val))
		return nil
	}
	fs := p.Fields(f.Val, path, limitFields...)
	l := &limit{line: f.Key.Line}
	if uf, ok := fs.Get("unlimited"); ok {
		l.unlimited, _ = p.Bool(uf, path+".unlimited")
	}
	if nf, ok := fs.Get("name"); ok {
		l.name, _ = p.text(nf, path+".name")
	}
	uf, hasUnit := fs.Get("unit")
	switch {
	case l.unlimited && hasUnit:
		p.Errorf(uf.Key.Line, path+".unit", "must not be set when unlimited is true")
	case l.unlimited:
	case !hasUnit:
		p.Errorf(f.Key.Line, path+".unit", "is required (second, minute, hour or day)")
	default:
		s, _ := p.text(uf, path+".unit")
		switch u := strings.ToUpper(s); u {
		case "SECOND", "MINUTE", "HOUR", "DAY":
			l.period = units[u]
			if u == "DAY" {
				l.calendar = policy.CalendarDay
			}
		case "WEEK", "MONTH", "YEAR":
			p.Errorf(uf.Key.Line, path+".unit", "cannot be converted: Envoy's %s windows (%s) match no ration window", strings.ToLower(u), map[string]string{
				"WEEK": "7 days from the Unix epoch, a Thursday", "MONTH": "30 days from the Unix epoch", "YEAR": "365 days from the Unix epoch"}[u])
		default:
			p.Errorf(uf.Key.Line, path+".unit", "must be second, minute, hour or day (got %s)", yamlfield.Describe(uf.Val))
		}
	}
	if rf, ok := fs.Get("requests_per_unit"); ok && !l.unlimited {
		v, ok := p.Int(rf, path+".requests_per_unit")
		switch {
		case !ok:
		case v <= 0:
			p.Errorf(rf.Key.Line, path+".requests_per_unit", "cannot be converted: %d denies every request; a ration rule's limit is > 0", v)
		case v > 1<<32-1:
			p.Errorf(rf.Key.Line, path+".requests_per_unit", "must be at most %d (Envoy's uint32)", uint32(1<<32-1))
		default:
			l.perUnit = v
		}
	} else if !ok && !l.unlimited {
		p.Errorf(f.Key.Line, path+".requests_per_unit", "cannot be converted: a missing requests_per_unit (0) denies every request; a ration rule's limit is > 0")
	}
	if rf, ok := fs.Get("replaces"); ok {
		l.replaces = p.replaces(rf, path+".replaces", l)
	}
	return l
}

func (p *parser) replaces(f yamlfield.Field, path string, l *limit) []ref {
	if f.Val.Kind != yaml.SequenceNode {
		p.Errorf(f.Key.Line, path, "must be a list of {name: ...} (got %s)", yamlfield.Describe(f.Val))
		return nil
	}
	var out []ref
	for i, n := range f.Val.Content {
		field := path + "[" + strconv.Itoa(i) + "]"
		if n.Kind != yaml.MappingNode {
			p.Errorf(n.Line, field, "must be a mapping with name (got %s)", yamlfield.Describe(n))
			continue
		}
		nf, ok := p.Fields(n, field, "name").Get("name")
		if !ok {
			p.Errorf(n.Line, field+".name", "is required")
			continue
		}
		s, _ := p.text(nf, field+".name")
		switch {
		case s == "":
			p.Errorf(nf.Key.Line, field+".name", "must not be empty")
		case s == l.name:
			p.Errorf(nf.Key.Line, field+".name", "a rate limit cannot replace itself (%q)", s)
		default:
			out = append(out, ref{name: s, field: field + ".name", line: nf.Key.Line})
		}
	}
	if l.unlimited && len(out) > 0 {
		p.Errorf(f.Key.Line, path, "cannot be converted: an unlimited rate limit has no ration rule to carry replaces")
	}
	return out
}
