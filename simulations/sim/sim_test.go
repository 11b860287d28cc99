package sim

import (
	"bufio"
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func load(t testing.TB, path string) *Scenario {
	t.Helper()
	sc, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// parseDoc parses a scenario written in a test.
func parseDoc(t testing.TB, name, doc string) *Scenario {
	t.Helper()
	sc, err := Parse(name, []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// testSeed returns *flagSeed, or a random seed when it is 0, and logs how
// to replay the test with it.
func testSeed(t testing.TB, flagSeed *uint64, flagName string) uint64 {
	t.Helper()
	seed := *flagSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (replay: go test ./simulations/sim -run '^%s$' -%s %d)", seed, t.Name(), flagName, seed)
	return seed
}

// outputs runs sc and returns summary.json without wall_s, and the CSV.
func outputs(t testing.TB, sc *Scenario, opt Options) (summary, csv []byte, res *Result) {
	t.Helper()
	res, err := Run(sc, opt)
	if err != nil {
		t.Fatalf("Run(%s, %s): %v", sc.Name, opt.Algorithm, err)
	}
	s := res.Summary
	s.WallSeconds = 0
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	if err := WriteCSV(w, res); err != nil {
		t.Fatal(err)
	}
	w.Flush()
	return s.JSON(), b.Bytes(), res
}

// TestGolden is the determinism contract: the same scenario and seed give
// byte-identical summary.json (all but wall_s) and time series, for every
// algorithm; another seed gives other results.
func TestGolden(t *testing.T) {
	sc := load(t, "testdata/golden.yaml")
	for _, alg := range Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			s1, c1, res := outputs(t, sc, Options{Algorithm: alg})
			s2, c2, _ := outputs(t, sc, Options{Algorithm: alg})
			if diff := cmp.Diff(string(s1), string(s2)); diff != "" {
				t.Errorf("summary.json of two runs with seed %d differs (-first +second):\n%s", sc.Seed, diff)
			}
			if !bytes.Equal(c1, c2) {
				t.Errorf("series.csv of two runs with seed %d differs", sc.Seed)
			}
			if got := res.Summary.BoundRatioMax; got > 1 {
				t.Errorf("bound_ratio_max got %v, want ≤ 1", got)
			}
			other := *sc
			other.Seed++
			s3, _, _ := outputs(t, &other, Options{Algorithm: alg})
			if bytes.Equal(s1, s3) {
				t.Errorf("seeds %d and %d gave the same summary", sc.Seed, other.Seed)
			}
		})
	}
}

// TestCommittedScenariosParse keeps every committed scenario valid.
func TestCommittedScenariosParse(t *testing.T) {
	files, err := filepath.Glob("../scenarios/*.yaml")
	if err != nil || len(files) < 10 {
		t.Fatalf("found %d scenarios (%v), want at least 10", len(files), err)
	}
	for _, f := range files {
		if _, err := LoadFile(f); err != nil {
			t.Errorf("%v", err)
		}
	}
}

// TestWriteFiles checks that a run writes every output.
func TestWriteFiles(t *testing.T) {
	sc := load(t, "testdata/golden.yaml")
	res, err := Run(sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := WriteFiles(dir, res); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"summary.json", "series.csv", "admitted.png", "shares.png", "bound.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: got %v, want a non-empty file", f, err)
		}
	}
}

// TestStoreOpsByCause: the store operations by cause add up to the ratio
// the table shows, and the probes are among the grant items.
func TestStoreOpsByCause(t *testing.T) {
	sc := load(t, "testdata/golden.yaml")
	res, err := Run(sc, Options{Algorithm: Escrow})
	if err != nil {
		t.Fatal(err)
	}
	s := res.Summary
	o := s.StoreOps
	if o == nil {
		t.Fatal("store_ops got nil, want the escrow run's causes")
	}
	if o.Grant == 0 || o.ShareWrite == 0 || o.Probe > o.Grant {
		t.Errorf("store_ops got %+v, want grant items and share writes, probes ≤ grant items", *o)
	}
	total := o.Grant + o.Return + o.ShareWrite
	if got, want := s.StoreOpsPerAdmitted, round4(float64(total)/float64(s.Admitted)); got != want {
		t.Errorf("store_ops_per_admitted got %v, want %v from store_ops %+v and %d admitted", got, want, *o, s.Admitted)
	}
	ideal, err := Run(sc, Options{Algorithm: Ideal})
	if err != nil {
		t.Fatal(err)
	}
	if ideal.Summary.StoreOps != nil {
		t.Errorf("ideal's store_ops got %+v, want none", *ideal.Summary.StoreOps)
	}
}
