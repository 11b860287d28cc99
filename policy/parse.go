package policy

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/internal/yamlfield"
)

// Limits on a document. They keep a mistaken or hostile document from
// costing unbounded memory or time in every regiond and agent it reaches.
const (
	// MaxDocumentSize is the largest document Parse accepts, in bytes.
	MaxDocumentSize = 4 << 20
	// MaxRules is the most rules one document may hold.
	MaxRules = 10_000
	// MaxPeriod is the longest period of a token bucket: 31 days. (A fixed
	// window's is at most a day, or the calendar words week and month.)
	MaxPeriod = 31 * 24 * time.Hour
	// MaxReclaimAfter is the longest partition_reclaim_after: 24 hours.
	MaxReclaimAfter = 24 * time.Hour
	// MaxTokens bounds limit, burst and cost: 2^53, the largest integer a
	// float64 holds exactly, because the allocator does its arithmetic in
	// float64.
	MaxTokens = 1 << 53
	// MaxProblems is the most problems Parse reports for one document; a
	// final problem counts the rest. It keeps a hostile document from
	// producing megabytes of error text (and of logs).
	MaxProblems = 100
	// MaxDescriptors bounds the entries of one rule's match and of its key,
	// which bounds the work Match does per candidate rule.
	MaxDescriptors = 32

	maxNameLen           = 64
	maxDescriptorNameLen = 128
	maxMatchValueLen     = 1024
)

// LoadFile reads and parses the policy document at path. An I/O error is
// returned wrapped (not ErrInvalid); a bad document gives Parse's Errors.
func LoadFile(path string) (*Set, error) {
	data, _, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// readFile reads at most MaxDocumentSize+1 bytes (enough for Parse to report
// a document as too large without reading all of it) and the file's stat
// taken from the open file.
func readFile(path string) ([]byte, os.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("policy: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("policy: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxDocumentSize+1))
	if err != nil {
		return nil, nil, fmt.Errorf("policy: reading %s: %w", path, err)
	}
	return data, fi, nil
}

// Parse validates a whole policy document and returns its Set, or Errors
// holding every problem found (up to MaxProblems, then one that counts the
// rest), sorted by line; file is used only in messages.
//
// The document is a mapping with one field, rules: a list (empty means no
// limits). Unknown fields at any level, duplicate keys, aliases, and more
// than one YAML document are errors. Numbers must be integers (floats are
// errors). Match values must be YAML strings: a number or boolean there is
// an error rather than silently stringified, because the text a YAML number
// stands for is ambiguous (1.10 is 1.1 to most tools, 0x10 is 16); quote it.
// Durations are Go duration strings ("1s", "250ms", "1m", "720h").
func Parse(file string, data []byte) (*Set, error) {
	p := &parser{Checker: yamlfield.Checker[invalid]{File: file, MaxProblems: MaxProblems}}
	rules := p.document(data)
	if err := p.Err(); err != nil {
		return nil, err
	}
	return newSet(rules, bytes.Clone(data)), nil
}

type parser struct {
	yamlfield.Checker[invalid]
	// zones caches the time zones loaded for this document, so a policy of
	// many rules in one zone reads its file once.
	zones map[string]*time.Location
	// refs are the replaces entries, checked once every name is known.
	refs []replaceRef
}

const emptyDocument = "document is empty; want a mapping with a rules list (an empty list means no limits)"

func (p *parser) document(data []byte) []*Rule {
	if len(data) > MaxDocumentSize {
		p.Errorf(0, "", "document is larger than %d bytes (4 MiB)", MaxDocumentSize)
		return nil
	}
	root := p.Root(data, yamlfield.Document{Empty: emptyDocument, Single: true, SyntaxLine: true})
	if root == nil {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		p.Errorf(root.Line, "", "document must be a mapping with a rules list (got %s)", yamlfield.Describe(root))
		return nil
	}
	fs := p.Fields(root, "", "rules")
	f, ok := fs.Get("rules")
	if !ok {
		p.Errorf(root.Line, "rules", "is required (an empty list means no limits)")
		return nil
	}
	return p.rules(f)
}

func (p *parser) rules(f yamlfield.Field) []*Rule {
	seq := f.Val
	if seq.Kind != yaml.SequenceNode {
		p.Errorf(f.Key.Line, "rules", "must be a list (got %s; use [] for no limits)", yamlfield.Describe(seq))
		return nil
	}
	if len(seq.Content) > MaxRules {
		p.Errorf(f.Key.Line, "rules", "too many rules (%d; the limit is %d)", len(seq.Content), MaxRules)
		return nil
	}
	rules := make([]*Rule, 0, len(seq.Content))
	names := make(map[string]int, len(seq.Content))
	for i, n := range seq.Content {
		path := "rules[" + strconv.Itoa(i) + "]"
		r, ok := p.rule(n, path)
		if !ok {
			continue
		}
		if first, dup := names[r.Name]; dup && r.Name != "" {
			p.Errorf(r.Line, path+".name", "duplicate rule name %q (first at line %d)", r.Name, first)
		} else {
			names[r.Name] = r.Line
		}
		rules = append(rules, r)
	}
	p.replaces(names)
	return rules
}

var ruleFields = []string{
	"name", "match", "key", "algorithm", "limit", "period", "time_zone", "burst", "cost", "scope",
	"on_error", "shadow", "partition_reclaim_after", "start_empty", "clients",
	"match_prefix", "except", "replaces", "allow_descriptor_limit",
}

// rule decodes and validates one rule. It returns ok=false only when the
// node is not a mapping; a rule with bad fields is returned with its errors
// recorded, so that later checks (duplicate names) still run.
func (p *parser) rule(n *yaml.Node, path string) (*Rule, bool) {
	if n.Kind != yaml.MappingNode {
		p.Errorf(n.Line, path, "must be a mapping (got %s)", yamlfield.Describe(n))
		return nil, false
	}
	fs := p.Fields(n, path, ruleFields...)
	r := &Rule{
		Line: n.Line, Algorithm: AlgorithmTokenBucket, Period: time.Second, Cost: 1,
		Scope: ScopeGlobal, OnError: OnErrorLocal,
	}
	p.ruleKey(fs, n, path, r)
	p.ruleAlgorithm(fs, path, r)
	p.ruleTokens(fs, n, path, r)
	p.ruleModes(fs, path, r)
	p.ruleEnvoy(fs, path, r)
	return r, true
}

// ruleKey decodes a rule's name, match and key.
func (p *parser) ruleKey(fs yamlfield.Fields, n *yaml.Node, path string, r *Rule) {
	if f, ok := fs.Get("name"); !ok {
		p.Errorf(n.Line, path+".name", "is required")
	} else if s, ok := p.Str(f, path+".name"); ok {
		p.name(f, path+".name", s)
		r.Name = s
	}
	if f, ok := fs.Get("match"); ok {
		r.Match = p.match(f, path+".match")
	}
	if f, ok := fs.Get("key"); !ok {
		p.Errorf(n.Line, path+".key", "is required (the descriptors that form the rate-limited key)")
	} else {
		r.Key = p.key(f, path+".key")
	}
}

// ruleTokens decodes a rule's limit, period, cost and burst. It runs after
// ruleAlgorithm: a fixed window's period may be a calendar word, and its
// capacity is its limit.
func (p *parser) ruleTokens(fs yamlfield.Fields, n *yaml.Node, path string, r *Rule) {
	limitOK := false
	if f, ok := fs.Get("limit"); !ok {
		p.Errorf(n.Line, path+".limit", "is required")
	} else {
		r.Limit, limitOK = p.tokens(f, path+".limit")
	}
	if f, ok := fs.Get("period"); ok {
		p.period(f, path+".period", r)
	}
	costOK := true
	if f, ok := fs.Get("cost"); ok {
		r.Cost, costOK = p.tokens(f, path+".cost")
	}
	f, burstGiven := fs.Get("burst")
	switch {
	case burstGiven && r.FixedWindow():
		p.Errorf(f.Key.Line, path+".burst", "does not apply to algorithm: fixed_window (a window admits limit tokens)")
	case burstGiven:
		var burstOK bool
		r.Burst, burstOK = p.tokens(f, path+".burst")
		if burstOK && costOK && r.Burst < r.Cost {
			p.Errorf(f.Key.Line, path+".burst", "must be >= cost (%d)", r.Cost)
		}
		return
	}
	if !limitOK {
		return
	}
	r.Burst = r.Limit
	if costOK && r.Burst < r.Cost {
		f, _ := fs.Get("cost")
		if r.FixedWindow() {
			p.Errorf(f.Key.Line, path+".cost", "must be <= limit (%d), the tokens of one window", r.Limit)
		} else {
			p.Errorf(f.Key.Line, path+".cost", "must be <= burst, which defaults to limit (%d)", r.Limit)
		}
	}
}

// ruleModes decodes a rule's scope, failure mode, flags and
// partition_reclaim_after.
func (p *parser) ruleModes(fs yamlfield.Fields, path string, r *Rule) {
	if f, ok := fs.Get("scope"); ok {
		if s, ok := p.Enum(f, path+".scope", string(ScopeGlobal), string(ScopeRegion)); ok {
			r.Scope = Scope(s)
		}
	}
	if f, ok := fs.Get("on_error"); ok {
		if s, ok := p.Enum(f, path+".on_error", string(OnErrorLocal), string(OnErrorOpen), string(OnErrorClosed)); ok {
			r.OnError = FailureMode(s)
		}
	}
	if f, ok := fs.Get("shadow"); ok {
		r.Shadow, _ = p.Bool(f, path+".shadow")
	}
	if f, ok := fs.Get("clients"); ok {
		r.Clients = p.clients(f, path+".clients")
	}
	if f, ok := fs.Get("start_empty"); ok {
		r.StartEmpty, _ = p.Bool(f, path+".start_empty")
		if r.StartEmpty && r.FixedWindow() {
			p.Errorf(f.Key.Line, path+".start_empty", "only applies to algorithm: token_bucket (every window starts with limit tokens)")
		}
	}
	if f, ok := fs.Get("partition_reclaim_after"); ok {
		field := path + ".partition_reclaim_after"
		if d, ok := p.duration(f, field, MaxReclaimAfter, "24h"); ok {
			switch {
			case d < 0:
				p.Errorf(f.Key.Line, field, "must be >= 0 (0 turns reclaiming off)")
			case d > 0 && r.Scope == ScopeRegion:
				p.Errorf(f.Key.Line, field, "only applies to scope: global (a region-scoped rule shares nothing to reclaim)")
			default:
				r.PartitionReclaimAfter = d
			}
		}
	}
}

// name checks a rule name: [a-z0-9][a-z0-9._-]*, at most 64 bytes. The
// narrow alphabet keeps names safe in metric labels, log lines and store keys.
func (p *parser) name(f yamlfield.Field, path, s string) {
	switch {
	case s == "":
		p.Errorf(f.Key.Line, path, "must not be empty")
	case len(s) > maxNameLen:
		p.Errorf(f.Key.Line, path, "must be at most %d characters (got %d)", maxNameLen, len(s))
	case !validName(s):
		p.Errorf(f.Key.Line, path, "must match [a-z0-9][a-z0-9._-]* (got %q)", s)
	}
}

func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}

func (p *parser) match(f yamlfield.Field, path string) []Descriptor {
	if f.Val.Kind != yaml.MappingNode {
		p.Errorf(f.Key.Line, path, "must be a mapping of descriptor names to values (got %s)", yamlfield.Describe(f.Val))
		return nil
	}
	fs := p.AnyFields(f.Val, path)
	if len(fs) > MaxDescriptors {
		p.Errorf(f.Key.Line, path, "has %d descriptors; the limit is %d", len(fs), MaxDescriptors)
		return nil
	}
	out := make([]Descriptor, 0, len(fs))
	for _, e := range fs {
		k := e.Name
		field := yamlfield.Join(path, k)
		if !p.descriptorName(e.Key.Line, field, k) {
			continue
		}
		if e.Val.Kind != yaml.ScalarNode || e.Val.ShortTag() != "!!str" {
			hint := ""
			if e.Val.Kind == yaml.ScalarNode && e.Val.ShortTag() != "!!null" {
				hint = fmt.Sprintf("; quote it to match the text: %q", e.Val.Value)
			}
			p.Errorf(e.Key.Line, field, "must be a string (got %s)%s", yamlfield.Describe(e.Val), hint)
			continue
		}
		v := e.Val.Value
		switch {
		case v == "":
			p.Errorf(e.Key.Line, field, "must not be empty (use %q for any value)", Wildcard)
		case len(v) > maxMatchValueLen:
			p.Errorf(e.Key.Line, field, "must be at most %d bytes (got %d)", maxMatchValueLen, len(v))
		default:
			out = append(out, Descriptor{Key: k, Value: v})
		}
	}
	slices.SortFunc(out, func(a, b Descriptor) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// nonEmptyList returns the items of f, a non-empty list of at most max
// items (what and noun name them in its errors), or reports why it is not
// one and returns nil.
func (p *parser) nonEmptyList(f yamlfield.Field, path, what, noun string, max int) []*yaml.Node {
	seq := f.Val
	if seq.Kind != yaml.SequenceNode || len(seq.Content) == 0 {
		p.Errorf(f.Key.Line, path, "must be a non-empty list of %s (got %s)", what, yamlfield.Describe(seq))
		return nil
	}
	if len(seq.Content) > max {
		p.Errorf(f.Key.Line, path, "has %d %s; the limit is %d", len(seq.Content), noun, max)
		return nil
	}
	return seq.Content
}

// clients decodes a rule's clients: identities (a client certificate's URI
// SAN, DNS name or common name), each exact or a prefix ending in "*".
func (p *parser) clients(f yamlfield.Field, path string) []string {
	items := p.nonEmptyList(f, path, "client identities", "identities", MaxClients)
	out := make([]string, 0, len(items))
	for i, n := range items {
		field := path + "[" + strconv.Itoa(i) + "]"
		switch {
		case n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str":
			p.Errorf(n.Line, field, "must be a client identity (got %s)", yamlfield.Describe(n))
		case n.Value == "" || len(n.Value) > maxClientLen || strings.ContainsFunc(n.Value, unicode.IsSpace) || strings.Contains(strings.TrimSuffix(n.Value, "*"), "*"):
			p.Errorf(n.Line, field, "must be an identity of 1 to %d characters without spaces, with at most a trailing * (got %q)", maxClientLen, n.Value)
		case slices.Contains(out, n.Value):
			p.Errorf(n.Line, field, "duplicate client %q", n.Value)
		default:
			out = append(out, n.Value)
		}
	}
	return out
}

func (p *parser) key(f yamlfield.Field, path string) []string {
	seq := f.Val
	if seq.Kind != yaml.SequenceNode {
		p.Errorf(f.Key.Line, path, "must be a list of descriptor names (got %s)", yamlfield.Describe(seq))
		return nil
	}
	switch {
	case len(seq.Content) == 0:
		p.Errorf(f.Key.Line, path, "must not be empty")
		return nil
	case len(seq.Content) > MaxDescriptors:
		p.Errorf(f.Key.Line, path, "has %d descriptors; the limit is %d", len(seq.Content), MaxDescriptors)
		return nil
	}
	out := make([]string, 0, len(seq.Content))
	for i, n := range seq.Content {
		field := path + "[" + strconv.Itoa(i) + "]"
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
			p.Errorf(n.Line, field, "must be a descriptor name (got %s)", yamlfield.Describe(n))
			continue
		}
		if !p.descriptorName(n.Line, field, n.Value) {
			continue
		}
		if j := slices.Index(out, n.Value); j >= 0 {
			p.Errorf(n.Line, field, "duplicate descriptor name %q", n.Value)
			continue
		}
		out = append(out, n.Value)
	}
	return out
}

// descriptorName checks a descriptor name: 1 to 128 bytes of
// [A-Za-z0-9_.:/-]. Names go into keys unescaped (AppendKey), so they must
// not hold the key's separators.
func (p *parser) descriptorName(line int, field, s string) bool {
	switch {
	case s == "":
		p.Errorf(line, field, "descriptor name must not be empty")
	case len(s) > maxDescriptorNameLen:
		p.Errorf(line, field, "descriptor name must be at most %d characters (got %d)", maxDescriptorNameLen, len(s))
	case !validDescriptorName(s):
		p.Errorf(line, field, "descriptor name must match [A-Za-z0-9_.:/-]+ (got %q)", s)
	default:
		return true
	}
	return false
}

func validDescriptorName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '_' || c == '.' || c == ':' || c == '/' || c == '-':
		default:
			return false
		}
	}
	return true
}
