package terraform

import (
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// TestDurationPattern checks the Go duration pattern of the module's
// validations and the unit table its locals convert durations with: every
// string the pattern accepts is a Go duration, common ones are accepted, and
// the module's milliseconds agree with time.ParseDuration.
func TestDurationPattern(t *testing.T) {
	m := loadModule(t, moduleDir)
	var pattern string
	for _, v := range []string{"sync_period", "decide_after", "lease_ttl", "store_timeout"} {
		block, ok := m.variables[v]
		if !ok {
			t.Fatalf("no variable %q", v)
		}
		var got []string
		for _, val := range block.Body.Blocks {
			if val.Type == "validation" {
				got = append(got, regexArgs(val.Body.Attributes["condition"].Expr, "regex")...)
			}
		}
		if len(got) != 1 || (pattern != "" && got[0] != pattern) {
			t.Fatalf("variable %q validates with regex patterns %q, want the one duration pattern %q", v, got, pattern)
		}
		pattern = got[0]
	}
	re := regexp.MustCompile(pattern)

	var units map[string]float64
	if diags := gohcl.DecodeExpression(m.locals["duration_unit_ms"].Expr, nil, &units); diags.HasErrors() {
		t.Fatal(diags)
	}
	split := regexArgs(m.locals["sync_period_ms"].Expr, "regexall")
	if len(split) != 1 {
		t.Fatalf("local sync_period_ms: got regexall patterns %q, want one", split)
	}
	parts := regexp.MustCompile(split[0])
	millis := func(s string) float64 {
		var ms float64
		for _, p := range parts.FindAllStringSubmatch(s, -1) {
			n, err := strconv.ParseFloat(p[1], 64)
			if err != nil {
				t.Fatalf("%q: the module's tonumber(%q) would fail", s, p[1])
			}
			ms += n * units[p[2]]
		}
		return ms
	}

	for _, s := range []string{"1s", "250ms", "1m30s", "1.5s", "100us", "100µs", "2h45m", "10ns", "0s"} {
		if !re.MatchString(s) {
			t.Errorf("%q: got rejected, want accepted", s)
		}
	}
	for _, s := range []string{"", "1", "s", "1 s", "-1s", "1sec", "1S", "1d", "1s ", "ms1"} {
		if re.MatchString(s) {
			t.Errorf("%q: got accepted, want rejected", s)
		}
	}
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 2))
	alphabet := []string{"0", "1", "2", "5", "9", ".", "ns", "us", "µs", "ms", "s", "m", "h", "-", " ", "d", "x"}
	accepted := 0
	for range 20000 {
		var b strings.Builder
		for range 1 + rng.IntN(8) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		s := b.String()
		if !re.MatchString(s) {
			continue
		}
		if millis(s) >= float64(math.MaxInt64)/float64(time.Millisecond) {
			continue // too long for a time.Duration: an overflow, not a syntax the pattern gets wrong
		}
		accepted++
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("seed %d: %q: got accepted by the pattern, want rejected (time.ParseDuration: %v)", seed, s, err)
		}
		// Go truncates each component to whole nanoseconds (1e-6 ms).
		if got, want := millis(s), float64(d)/float64(time.Millisecond); math.Abs(got-want) > 1e-5+1e-9*want {
			t.Fatalf("seed %d: %q: got %v ms from the module's unit table, want %v", seed, s, got, want)
		}
	}
	if accepted < 100 {
		t.Fatalf("seed %d: only %d random strings were durations, want at least 100 to mean anything", seed, accepted)
	}
}

// regexArgs returns the literal first argument of every call of fn in e.
func regexArgs(e hclsyntax.Expression, fn string) []string {
	var got []string
	hclsyntax.VisitAll(e, func(n hclsyntax.Node) hcl.Diagnostics {
		if call, ok := n.(*hclsyntax.FunctionCallExpr); ok && call.Name == fn && len(call.Args) > 0 {
			if s, ok := literalString(call.Args[0]); ok {
				got = append(got, s)
			}
		}
		return nil
	})
	return got
}
