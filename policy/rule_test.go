package policy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

func TestAppendKey(t *testing.T) {
	tenant := &Rule{Key: []string{"tenant"}}
	two := &Rule{Key: []string{"tenant", "route"}}
	tests := []struct {
		name string
		r    *Rule
		ds   []Descriptor
		want string
	}{
		{"one key", tenant, []Descriptor{{"tenant", "acme"}}, "tenant=acme"},
		{"rule order, not request order", two, []Descriptor{{"route", "/v1/x"}, {"method", "GET"}, {"tenant", "acme"}}, "tenant=acme,route=/v1/x"},
		{"first occurrence wins", tenant, []Descriptor{{"tenant", "a"}, {"tenant", "b"}}, "tenant=a"},
		{"empty value", tenant, []Descriptor{{"tenant", ""}}, "tenant="},
		{"missing value", two, []Descriptor{{"tenant", "a"}}, "tenant=a,route"},
		{"separators", tenant, []Descriptor{{"tenant", "a=b,c%d"}}, "tenant=a%3Db%2Cc%25d"},
		{"hash tag braces", tenant, []Descriptor{{"tenant", "{x}"}}, "tenant=%7Bx%7D"},
		{"space and controls", tenant, []Descriptor{{"tenant", "a b\n\x00\x7f"}}, "tenant=a%20b%0A%00%7F"},
		{"valid UTF-8 kept", tenant, []Descriptor{{"tenant", "café-東京"}}, "tenant=café-東京"},
		{"invalid UTF-8 escaped", tenant, []Descriptor{{"tenant", "a\xffb\xc3"}}, "tenant=a%FFb%C3"},
		{"encoded U+FFFD kept", tenant, []Descriptor{{"tenant", "\uFFFD"}}, "tenant=\uFFFD"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := string(tc.r.AppendKey([]byte("prefix:"), tc.ds))
			if want := "prefix:" + tc.want; got != want {
				t.Errorf("AppendKey: got %q, want %q", got, want)
			}
		})
	}
}

// decodeKey inverts AppendKey for rule r: the reference that shows the
// encoding is injective (a function with a left inverse is).
func decodeKey(r *Rule, key string) ([]string, error) {
	parts := strings.Split(key, ",")
	if len(parts) != len(r.Key) {
		return nil, fmt.Errorf("got %d parts, want %d", len(parts), len(r.Key))
	}
	values := make([]string, len(parts))
	for i, p := range parts {
		name, v, ok := strings.Cut(p, "=")
		if !ok || name != r.Key[i] {
			return nil, fmt.Errorf("part %d %q: want %s=value", i, p, r.Key[i])
		}
		var b []byte
		for j := 0; j < len(v); j++ {
			if v[j] != '%' {
				b = append(b, v[j])
				continue
			}
			if j+2 >= len(v) {
				return nil, errors.New("truncated escape")
			}
			n, err := strconv.ParseUint(v[j+1:j+3], 16, 8)
			if err != nil {
				return nil, err
			}
			b = append(b, byte(n))
			j += 2
		}
		values[i] = string(b)
	}
	return values, nil
}

func TestAppendKeyInjective(t *testing.T) {
	rng := newRand(t)
	// Values drawn from an alphabet heavy in the bytes that need escaping,
	// so collisions would show if the encoding had any.
	alphabet := []string{"a", "b", "%", "=", ",", "{", "}", " ", "\x00", "\n", "\x7f", "é", "\xff", "\xc3", "%25", "\uFFFD"}
	r := &Rule{Key: []string{"tenant", "route", "ip"}}
	seen := make(map[string][]string)
	for range 20000 {
		values := make([]string, len(r.Key))
		ds := make([]Descriptor, len(r.Key))
		for i := range values {
			var b strings.Builder
			for range rng.IntN(5) {
				b.WriteString(alphabet[rng.IntN(len(alphabet))])
			}
			values[i] = b.String()
			ds[i] = Descriptor{r.Key[i], values[i]}
		}
		rng.Shuffle(len(ds), func(i, j int) { ds[i], ds[j] = ds[j], ds[i] })
		key := string(r.AppendKey(nil, ds))
		if !utf8.ValidString(key) {
			t.Fatalf("AppendKey(%q): got invalid UTF-8 %q, want valid", values, key)
		}
		got, err := decodeKey(r, key)
		if err != nil {
			t.Fatalf("decode(%q) of values %q: %v", key, values, err)
		}
		if diff := cmp.Diff(values, got); diff != "" {
			t.Fatalf("decode(AppendKey(%q)) = %q (-want +got):\n%s", values, key, diff)
		}
		if prev, ok := seen[key]; ok && !cmp.Equal(prev, values) {
			t.Fatalf("AppendKey: got %q for both %q and %q, want distinct keys", key, prev, values)
		}
		seen[key] = values
	}
}

func TestAppendKeyAllocs(t *testing.T) {
	r := &Rule{Key: []string{"tenant", "route"}}
	ds := []Descriptor{{"route", "/v1/a b"}, {"tenant", "acme"}}
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = r.AppendKey(buf[:0], ds) }); n != 0 {
		t.Errorf("AppendKey with room in dst: got %v allocs, want 0", n)
	}
}

func TestApplies(t *testing.T) {
	r := &Rule{
		Match: []Descriptor{{"method", "POST"}, {"route", Wildcard}},
		Key:   []string{"tenant"},
	}
	tests := []struct {
		ds   []Descriptor
		want bool
	}{
		{[]Descriptor{{"tenant", "a"}, {"method", "POST"}, {"route", "/x"}}, true},
		{[]Descriptor{{"route", ""}, {"method", "POST"}, {"tenant", ""}}, true},
		{[]Descriptor{{"tenant", "a"}, {"method", "GET"}, {"route", "/x"}}, false},
		{[]Descriptor{{"tenant", "a"}, {"method", "POST"}}, false},
		{[]Descriptor{{"method", "POST"}, {"route", "/x"}}, false},
		{[]Descriptor{{"tenant", "a"}, {"method", "GET"}, {"method", "POST"}, {"route", "/x"}}, false},
		{[]Descriptor{{"tenant", "a"}, {"method", "POST"}, {"method", "GET"}, {"route", "/x"}}, true},
		{nil, false},
	}
	for _, tc := range tests {
		if got := r.Applies(tc.ds); got != tc.want {
			t.Errorf("Applies(%v): got %v, want %v", tc.ds, got, tc.want)
		}
	}
}

func TestRate(t *testing.T) {
	for _, tc := range []struct {
		limit  int64
		period time.Duration
		want   float64
	}{
		{500, time.Second, 500},
		{60, time.Minute, 1},
		{1, 100 * time.Millisecond, 10},
		{86400, 24 * time.Hour, 1},
	} {
		r := &Rule{Limit: tc.limit, Period: tc.period}
		if got := r.Rate(); got != tc.want {
			t.Errorf("Rate(limit %d, period %s): got %v, want %v", tc.limit, tc.period, got, tc.want)
		}
	}
	// A fixed window's rate spreads its limit over its nominal length.
	for _, tc := range []struct {
		period string
		limit  int64
		want   float64
	}{
		{"1m", 60, 1},
		{"day", 86400, 1},
		{"week", 7 * 86400, 1},
		{"month", 2_629_746, 1},
		{"month", 12, 12 / (365.2425 * 86400 / 12)},
	} {
		r := fixedRule(t, "Europe/Berlin", tc.period)
		r.Limit = tc.limit
		if got := r.Rate(); got != tc.want {
			t.Errorf("Rate(fixed window, limit %d, period %s): got %v, want %v", tc.limit, tc.period, got, tc.want)
		}
	}
}

func TestRuleClients(t *testing.T) {
	set, err := Parse("c.yaml", []byte(`
rules:
  - name: payments
    key: [tenant]
    limit: 10
    clients: ["spiffe://example.org/ns/payments/*", gateway.eu.internal]
  - name: open
    key: [tenant]
    limit: 10
`))
	if err != nil {
		t.Fatal(err)
	}
	pay, open := set.Rule("payments"), set.Rule("open")
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"spiffe://example.org/ns/payments/sa/gw", true},
		{"spiffe://example.org/ns/payments/", true},
		{"spiffe://example.org/ns/billing/sa/gw", false},
		{"gateway.eu.internal", true},
		{"gateway.eu.internal.evil", false},
		{"", false},
	} {
		if got := pay.Allows(tc.id); got != tc.want {
			t.Errorf("payments allows %q: got %v, want %v", tc.id, got, tc.want)
		}
		if !open.Allows(tc.id) {
			t.Errorf("a rule without clients refused %q", tc.id)
		}
	}
	for _, doc := range []string{
		"clients: []",
		"clients: gateway",
		"clients: [\"a b\"]",
		"clients: [\"a*b\"]",
		"clients: [x, x]",
		"clients: [1]",
	} {
		_, err := Parse("c.yaml", []byte("rules:\n  - name: r\n    key: [t]\n    limit: 1\n    "+doc+"\n"))
		if err == nil || !strings.Contains(err.Error(), "rules[0].clients") {
			t.Errorf("%s: got %v, want an error at rules[0].clients", doc, err)
		}
	}
	// The policy's version covers clients.
	a, _ := Parse("a.yaml", []byte("rules:\n  - {name: r, key: [t], limit: 1, clients: [a]}\n"))
	b, _ := Parse("b.yaml", []byte("rules:\n  - {name: r, key: [t], limit: 1, clients: [b]}\n"))
	if a.Version() == b.Version() {
		t.Error("two policies differing only in clients have the same version")
	}
}
