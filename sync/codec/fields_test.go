package codec

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/region"
)

// fill sets every field reachable from v to a random non-zero value, so
// that a field region adds to Report or Snapshot and the codec does not
// carry fails the round trips below. A field of a kind it does not know
// fails the test: teach it the kind, and the codec the field.
func fill(t *testing.T, rng *rand.Rand, v reflect.Value, path string) {
	t.Helper()
	if v.Type() == reflect.TypeFor[time.Time]() {
		v.Set(reflect.ValueOf(time.Unix(1_700_000_000+rng.Int64N(1e6), 1+rng.Int64N(1e9-1))))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", rng.IntN(1000)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int64:
		v.SetInt(rng.Int64N(1<<40) - 1<<39 | 1)
	case reflect.Uint64:
		v.SetUint(1 + rng.Uint64N(1<<40))
	case reflect.Uint32:
		v.SetUint(1 + rng.Uint64N(1<<31))
	case reflect.Float64:
		v.SetFloat(rng.Float64() * 1000)
	case reflect.Slice:
		n := 1 + rng.IntN(3)
		s := reflect.MakeSlice(v.Type(), n, n)
		for i := 0; i < n; i++ {
			fill(t, rng, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			fill(t, rng, v.Field(i), path+"."+f.Name)
		}
	default:
		t.Fatalf("fill: %s has kind %s, which the test does not know", path, v.Kind())
	}
}

func TestEveryReportFieldRoundTrips(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 2))
	for i := 0; i < 20; i++ {
		var want region.Report
		fill(t, rng, reflect.ValueOf(&want).Elem(), "Report")
		for _, v := range []Version{V1, V2, V3} {
			msgs, err := EncodeReportVersion(&want, 7, 1<<20, v)
			if err != nil {
				t.Fatal(err)
			}
			got := decodeAll(t, NewAssembler(AssemblerConfig{}), time.Now(), msgs)
			if diff := cmp.Diff(&want, got); diff != "" {
				t.Fatalf("V%d (-want +got):\n%s", v, diff)
			}
		}
	}
}

func TestEverySnapshotFieldRoundTrips(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 3))
	for i := 0; i < 20; i++ {
		var want region.Snapshot
		fill(t, rng, reflect.ValueOf(&want).Elem(), "Snapshot")
		want.Partial, want.Removed = false, nil // a store's to apply, not encoded
		b, err := EncodeSnapshot(&want)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeSnapshot(b)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("(-want +got):\n%s", diff)
		}
	}
}
