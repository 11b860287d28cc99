package sim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const goodHead = "name: x\nduration: 10s\nregions: [us, eu]\nkeys:\n  - { name: k, limit: 10 }\ndemand:\n  - { at: 0s, rates: { us: 1 } }\n"

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"empty", "", "s.yaml: document is empty"},
		{"unknown field", "name: x\ncolour: red\n", "s.yaml:2: colour: unknown field"},
		{"missing duration", "name: x\nregions: [us]\nkeys: [{name: k, limit: 1}]\ndemand: [{at: 0s, rates: {us: 1}}]\n", "s.yaml:1: duration: is required"},
		{"bad duration", strings.Replace(goodHead, "duration: 10s", "duration: 10", 1), `s.yaml:2: duration: must be a Go duration such as "1s" or "500ms" (got integer 10)`},
		{"unknown region in rates", goodHead + "  - { at: 1s, rates: { mars: 1 } }\n", "s.yaml:8: demand[1].rates.mars: unknown field (known: eu, us)"},
		{"demand out of order", goodHead + "  - { at: 0s, rates: { us: 2 } }\n", "s.yaml:8: demand[1].at: must be after the previous step's (0s)"},
		{"demand step not a mapping", goodHead + "  - 5\n  - { at: 0s, rates: { us: 2 } }\n", "s.yaml:9: demand[2].at: must be after the previous step's (0s)"},
		{"fault region", goodHead + "faults:\n  - { at: 1s, partition: mars, for: 1s }\n", `s.yaml:9: faults[0].partition: unknown region "mars" (regions: eu, us)`},
		{"two fault kinds", goodHead + "faults:\n  - { at: 1s, partition: us, redis_failover: us, for: 1s }\n", "s.yaml:9: faults[0]: needs exactly one of"},
		{"fraction", goodHead + "faults:\n  - { at: 1s, crash_agents: 2, region: us }\n", "s.yaml:9: faults[0].crash_agents: must be a fraction in (0, 1]"},
		{"cost above burst", strings.Replace(goodHead, "limit: 10 }", "limit: 10, cost: 11 }", 1), "s.yaml:5: keys[0].cost: must be <= burst (10)"},
		{"loss", goodHead + "network: { loss: 1.5 }\n", "s.yaml:8: network.loss: must be in [0, 1)"},
		{"fault after end", goodHead + "faults:\n  - { at: 20s, partition: us, for: 1s }\n", "s.yaml:9: faults[0].at: must be before the end (10s)"},
		{"syntax", "name: [x\n", "s.yaml: YAML syntax error"},
		{"duplicate field", goodHead + "name: y\n", "s.yaml:8: name: duplicate key (first at line 1)"},
		{"unreachable needs for", goodHead + "faults:\n  - { at: 1s, unreachable: us }\n", "s.yaml:9: faults[0].for: is required for unreachable"},
		{"restart needs for", goodHead + "faults:\n  - { at: 1s, restart: us }\n", "s.yaml:9: faults[0].for: is required for restart"},
		{"policy_mismatch needs for", goodHead + "faults:\n  - { at: 1s, policy_mismatch: us }\n", "s.yaml:9: faults[0].for: is required for policy_mismatch"},
		{"limit_factor of 1", goodHead + "faults:\n  - { at: 1s, policy_mismatch: us, for: 1s, limit_factor: 1 }\n", "s.yaml:9: faults[0].limit_factor: must be in (0, 1000] and not 1"},
		{"limit_factor elsewhere", goodHead + "faults:\n  - { at: 1s, partition: us, for: 1s, limit_factor: 2 }\n", "s.yaml:9: faults[0].limit_factor: does not apply to partition"},
		{"unreachable region", goodHead + "faults:\n  - { at: 1s, unreachable: mars, for: 1s }\n", `s.yaml:9: faults[0].unreachable: unknown region "mars"`},
		{"negative seed", "seed: -1\n" + goodHead, "s.yaml:1: seed: must be an integer in [0, 2^64) (got integer -1)"},
		{"negative reclaim", strings.Replace(goodHead, "limit: 10 }", "limit: 10, partition_reclaim_after: -1s }", 1), "s.yaml:5: keys[0].partition_reclaim_after: must not be negative"},
		{"reclaim not a duration", strings.Replace(goodHead, "limit: 10 }", "limit: 10, partition_reclaim_after: soon }", 1), `s.yaml:5: keys[0].partition_reclaim_after: must be a Go duration`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { wantParseError(t, tc.doc, tc.want) })
	}
}

// wantParseError parses doc as s.yaml and wants an error wrapping
// ErrInvalid, a *FieldError of that file, whose text contains want.
func wantParseError(t *testing.T, doc, want string) {
	t.Helper()
	sc, err := Parse("s.yaml", []byte(doc))
	if err == nil {
		t.Fatalf("got scenario %+v, want error %q", sc, want)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("got error %v, want one wrapping ErrInvalid", err)
	}
	if fe := (*FieldError)(nil); !errors.As(err, &fe) || fe.File != "s.yaml" || !errors.Is(fe, ErrInvalid) {
		t.Errorf("errors.As(%v, *FieldError): got %#v, want the first problem, wrapping ErrInvalid", err, fe)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("got error\n%v\nwant it to contain\n%s", err, want)
	}
}

func TestParseDefaults(t *testing.T) {
	sc, err := Parse("s.yaml", []byte(goodHead))
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case sc.Step != 1e6, sc.SyncPeriod != 1e9, sc.LeaseTTL != 100e6, sc.AgentsPerRegion != 1:
		t.Errorf("got step %v, sync %v, ttl %v, agents %d; want 1ms, 1s, 100ms, 1", sc.Step, sc.SyncPeriod, sc.LeaseTTL, sc.AgentsPerRegion)
	case sc.Keys[0].Burst != 10 || sc.Keys[0].Cost != 1 || sc.Keys[0].Count != 1:
		t.Errorf("got key %+v, want burst 10, cost 1, count 1", sc.Keys[0])
	case sc.Keys[0].Period != time.Second || sc.Keys[0].RuleAlgorithm != TokenBucket:
		t.Errorf("got key %+v, want period 1s, algorithm token_bucket", sc.Keys[0])
	case strings.Join(sc.Regions, ",") != "eu,us":
		t.Errorf("got regions %v, want them sorted", sc.Regions)
	}
}

// FuzzParse feeds Parse arbitrary documents: it must return a scenario or
// an ErrInvalid error, never panic. The seed corpus is every committed
// scenario and testdata/*.yaml.
func FuzzParse(f *testing.F) {
	for _, pat := range []string{"../scenarios/*.yaml", "testdata/*.yaml"} {
		files, _ := filepath.Glob(pat)
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	f.Add([]byte(goodHead))
	f.Fuzz(func(t *testing.T, data []byte) {
		sc, err := Parse("f.yaml", data)
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("error %v does not wrap ErrInvalid", err)
		}
		if err == nil && (sc.Duration <= 0 || len(sc.Regions) == 0 || len(sc.Keys) == 0 || len(sc.Demand) == 0) {
			t.Fatalf("accepted an incomplete scenario: %+v", sc)
		}
	})
}

// TestReadmeExampleParses keeps the scenario example of README.md, which
// shows every field, valid.
func TestReadmeExampleParses(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "## Scenario files\n\n```yaml\n")
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("README.md has no yaml block under \"## Scenario files\"")
	}
	sc, err := Parse("README.md example", []byte(example))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, f := range sc.Faults {
		kinds[f.Kind] = true
	}
	for _, k := range []string{"partition", "redis_failover", "crash_agents", "add_agents", "unreachable", "restart", "policy_mismatch",
		"crash_proxies", "disconnect_proxies"} {
		if !kinds[k] {
			t.Errorf("the README example shows no %s fault", k)
		}
	}
	if sc.RLQS == nil || sc.RLQS.Fallback.Kind != FallbackTokenBucket {
		t.Errorf("the README example shows no rlqs block with a token-bucket fallback (got %+v)", sc.RLQS)
	}
}
