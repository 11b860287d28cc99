package policy

import (
	"strings"
	"time"
	"unicode/utf8"
)

// Scope says whether a rule's limit is shared by all regions or applies in
// each region on its own.
type Scope string

const (
	// ScopeGlobal (the default) shares one limit across every region: the
	// regions hold shares of it (DESIGN.md, "Level 2").
	ScopeGlobal Scope = "global"
	// ScopeRegion gives every region the whole limit for itself; the
	// regions exchange nothing for the rule.
	ScopeRegion Scope = "region"
)

// FailureMode is what an agent does for a rule when its region cannot be
// reached (DESIGN.md, "Failure modes").
type FailureMode string

const (
	// OnErrorLocal (the default) spends held leases, then an emergency
	// local bucket: approximate and bounded.
	OnErrorLocal FailureMode = "local"
	// OnErrorOpen admits and marks the decision FAILED_OPEN.
	OnErrorOpen FailureMode = "open"
	// OnErrorClosed denies with 503 semantics.
	OnErrorClosed FailureMode = "closed"
)

// Algorithm is how a rule admits tokens.
type Algorithm string

const (
	// AlgorithmTokenBucket (the default) refills Limit tokens per Period,
	// continuously, into a bucket of Burst tokens. The zero value "" (a Rule
	// built by hand) means the same; test with Rule.FixedWindow.
	AlgorithmTokenBucket Algorithm = "token_bucket"
	// AlgorithmFixedWindow admits Limit tokens per window; windows follow
	// the calendar of the rule's Location (Rule.Window).
	AlgorithmFixedWindow Algorithm = "fixed_window"
)

// Calendar names a fixed window's calendar period: a window that is a day,
// a week or a month of the local calendar rather than a fixed duration.
type Calendar string

const (
	// CalendarDay windows start at local midnight (yaml period: day or 24h).
	CalendarDay Calendar = "day"
	// CalendarWeek windows start on Monday at local midnight.
	CalendarWeek Calendar = "week"
	// CalendarMonth windows start on the 1st at local midnight.
	CalendarMonth Calendar = "month"
)

// Descriptor is one key/value describing a request: tenant=acme,
// route=/v1/x, method=POST, ip=192.0.2.1.
type Descriptor struct{ Key, Value string }

// Wildcard as a match value means "present with any value". There is no way
// to match a literal "*".
const Wildcard = "*"

// Rule is one validated rule of a Set. Rules are shared by every user of
// their Set and must not be modified.
type Rule struct {
	// Name is unique within its Set: [a-z0-9][a-z0-9._-]*, at most 64 bytes.
	Name string
	// Match lists the descriptors a request must carry, sorted by Key, keys
	// unique. Each must be present with an equal Value; the Value Wildcard
	// means present with any value. Empty: the rule matches any request that
	// has all of Key.
	Match []Descriptor
	// MatchPrefix (yaml match_prefix: descriptor names to prefixes) lists
	// descriptors a request must carry with a value that starts with the
	// given prefix (not empty). Sorted by Key, keys unique.
	MatchPrefix []Descriptor
	// Except (yaml except: descriptor names to lists of values) lists
	// values that exclude a request: the rule does not apply when one of
	// these descriptors is present with that value, or, for a Value ending
	// in "*", with a value starting with what precedes the "*". Sorted by
	// Key, then Value. It lets a rule for "any value" step aside for the values other
	// rules (or no rule) govern, as an imported Envoy configuration needs.
	Except []Descriptor
	// Key lists the descriptor names whose values form the rate-limited key,
	// in the order written; all must be present for the rule to apply.
	Key []string
	// Algorithm defaults to AlgorithmTokenBucket.
	Algorithm Algorithm
	// Limit is the tokens granted per Period (per window for a fixed
	// window); > 0.
	Limit int64
	// Period is a token bucket's refill period: > 0 and at most MaxPeriod.
	// For a fixed window it is the window's length: a whole number of
	// seconds that divides a day, or for a calendar window the nominal
	// length of its Calendar (NominalDay, NominalWeek, NominalMonth).
	// Default 1s.
	Period time.Duration
	// Calendar (from yaml period: day, week, month, or 24h) is set only for
	// a fixed window whose windows are calendar days, weeks or months; ""
	// otherwise, when windows are Period long.
	Calendar Calendar
	// Location (yaml time_zone, an IANA name) is the time zone whose wall
	// clock and calendar a fixed window's windows follow; time.UTC by
	// default, and nil for a token bucket. Window treats nil as UTC.
	Location *time.Location
	// Burst is the bucket's capacity in tokens; >= Cost. Default Limit.
	// A fixed window's is always Limit (yaml burst is refused there).
	Burst int64
	// Cost is the tokens one request spends; > 0 and <= Burst. Default 1.
	Cost int64
	// Scope defaults to ScopeGlobal.
	Scope Scope
	// OnError defaults to OnErrorLocal.
	OnError FailureMode
	// Shadow rules decide and record but never deny.
	Shadow bool
	// PartitionReclaimAfter (yaml partition_reclaim_after) lets the other
	// regions reclaim a silent region's share after this long, trading a
	// documented overshoot for utilisation. 0 (the default) never reclaims.
	// Only for ScopeGlobal rules.
	PartitionReclaimAfter time.Duration
	// StartEmpty (yaml start_empty) makes a bucket missing from the store
	// start empty instead of full: no excess after a store data loss, at the
	// price of a short under-admission. Only for token buckets: every window
	// starts with its Limit.
	StartEmpty bool
	// Clients (yaml clients), when not empty, are the only callers
	// regiond lets lease the rule's keys: identities from their client
	// certificates (URI SAN, such as a SPIFFE ID, else DNS name, else
	// common name), each exact or, ending in "*", a prefix. Empty: any
	// caller the lease API accepts.
	Clients []string
	// Replaces (yaml replaces) names rules that do not apply to a request
	// this rule applies to: Set.Match leaves them out, and the Envoy
	// adapter leaves them out of every descriptor of the Envoy request.
	Replaces []string
	// AllowDescriptorLimit (yaml allow_descriptor_limit) lets an Envoy
	// descriptor's limit override select this rule: when the override
	// equals the rule's limit and period, the Envoy adapter passes it as a
	// descriptor the rule matches (lease/agent/envoyrls). The rule's own
	// limit still decides: an override can select a rule, never change one.
	AllowDescriptorLimit bool
	// Line is the line of the rule in its file, for messages.
	Line int
}

// MaxClients bounds a rule's clients.
const MaxClients = 256

const maxClientLen = 512

// Allows reports whether the caller identity may lease the rule's keys.
func (r *Rule) Allows(identity string) bool {
	if len(r.Clients) == 0 {
		return true
	}
	for _, c := range r.Clients {
		if p, ok := strings.CutSuffix(c, "*"); ok {
			if strings.HasPrefix(identity, p) && identity != "" {
				return true
			}
		} else if identity == c {
			return true
		}
	}
	return false
}

// Rate returns the rule's rate in tokens per second: Limit / Period. For a
// token bucket it is the refill rate. For a fixed window it is the average
// rate that spends one window's Limit over the window's length; for a
// calendar window over its nominal length (Period), not the current
// window's, so the rate does not change with the month or on a DST day. It
// assumes a valid rule (Period > 0).
func (r *Rule) Rate() float64 {
	return float64(r.Limit) / r.Period.Seconds()
}

// FixedWindow reports whether the rule is a fixed window rather than a
// token bucket.
func (r *Rule) FixedWindow() bool { return r.Algorithm == AlgorithmFixedWindow }

// Applies reports whether the rule applies to a request described by ds:
// every Match descriptor is present with an equal value (or any value for
// Wildcard), every MatchPrefix descriptor is present with a value of its
// prefix, no Except descriptor is present with its value (or prefix), and
// every Key descriptor is present. When ds holds a key more
// than once, the first occurrence counts.
func (r *Rule) Applies(ds []Descriptor) bool {
	for _, m := range r.Match {
		v, ok := lookup(ds, m.Key)
		if !ok || (m.Value != Wildcard && v != m.Value) {
			return false
		}
	}
	for _, m := range r.MatchPrefix {
		if v, ok := lookup(ds, m.Key); !ok || !strings.HasPrefix(v, m.Value) {
			return false
		}
	}
	for _, e := range r.Except {
		if v, ok := lookup(ds, e.Key); ok && excepted(v, e.Value) {
			return false
		}
	}
	for _, k := range r.Key {
		if _, ok := lookup(ds, k); !ok {
			return false
		}
	}
	return true
}

// excepted reports whether v is what an Except value names: equal, or for
// a value ending in "*", starting with what precedes it.
func excepted(v, except string) bool {
	if p, ok := strings.CutSuffix(except, Wildcard); ok {
		return strings.HasPrefix(v, p)
	}
	return v == except
}

// lookup returns the value of the first descriptor named key. A linear scan:
// requests carry a handful of descriptors, fewer than a map would pay off.
func lookup(ds []Descriptor, key string) (string, bool) {
	for i := range ds {
		if ds[i].Key == key {
			return ds[i].Value, true
		}
	}
	return "", false
}

// AppendKey appends the rule's key for the request ds to dst and returns the
// extended slice; it does not allocate when dst has room.
//
// The key is "name=value" for each name of r.Key in order, joined by ",":
// "tenant=acme,route=/v1/transfers". Values are percent-encoded where they
// hold '%', '=', ',', '{', '}', a space, an ASCII control byte, DEL, or a
// byte that is not part of valid UTF-8, so the key is valid UTF-8 (it
// travels in protobuf strings), has no Redis hash-tag braces, and is
// injective: two different value tuples never give the same key. Descriptor
// names are validated by Parse to need no escaping.
//
// The precondition is that r applies to ds. A name missing from ds is
// written without "=" (so it differs from a present empty value).
func (r *Rule) AppendKey(dst []byte, ds []Descriptor) []byte {
	for i, k := range r.Key {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, k...)
		v, ok := lookup(ds, k)
		if !ok {
			continue
		}
		dst = append(dst, '=')
		dst = appendEscaped(dst, v)
	}
	return dst
}

// mustEscape marks the ASCII bytes that AppendKey percent-encodes.
var mustEscape = func() (t [utf8.RuneSelf]bool) {
	for c := 0; c <= ' '; c++ {
		t[c] = true
	}
	for _, c := range "%=,{}\x7f" {
		t[c] = true
	}
	return t
}()

// appendEscaped appends v with the bytes AppendKey documents percent-encoded.
// Runs of plain bytes are appended whole, so a value that needs no escaping
// costs one copy.
func appendEscaped(dst []byte, v string) []byte {
	const hex = "0123456789ABCDEF"
	start := 0
	for i := 0; i < len(v); {
		c := v[i]
		if c < utf8.RuneSelf {
			if !mustEscape[c] {
				i++
				continue
			}
		} else {
			r, size := utf8.DecodeRuneInString(v[i:])
			if r != utf8.RuneError || size != 1 {
				i += size
				continue
			}
		}
		dst = append(dst, v[start:i]...)
		dst = append(dst, '%', hex[c>>4], hex[c&0xf])
		i++
		start = i
	}
	return append(dst, v[start:]...)
}
