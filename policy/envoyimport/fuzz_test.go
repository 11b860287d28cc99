package envoyimport

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ration-dev/ration/policy"
)

// FuzzConvert: any file converts without panicking, to an error that wraps
// ErrInvalid or to a document policy.Parse accepts as the same rules.
func FuzzConvert(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.y*ml"))
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"domain: d\ndescriptors:\n  - key: k\n    value: \"*\"\n    rate_limit: {unit: minute, requests_per_unit: 2, name: n}\n    descriptors:\n      - {key: j, rate_limit: {unit: day, requests_per_unit: 1, replaces: [{name: n}]}}\n",
		"domain: d\ndescriptors:\n  - {key: k, value: 1.10, shadow_mode: true, rate_limit: {unit: HOUR, requests_per_unit: 4294967295}}\n  - {key: k, rate_limit: {unlimited: true}}\n",
		"domain: d\ndescriptors:\n  - key: k\n    value: foo*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - {key: k, value: f*, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: k, value: foo, descriptors: [{key: j, value: x*, rate_limit: {unit: minute, requests_per_unit: 3}}]}\n",
		"domain: \"\"\n",
		"domain: d\ndescriptors:\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := Convert([]File{{Name: "f.yaml", Data: data}})
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		set, err := policy.Parse("again.yaml", res.Set.Source())
		if err != nil {
			t.Fatalf("the converted document does not parse: %v\n%s", err, res.Set.Source())
		}
		if set.Version() != res.Set.Version() {
			t.Fatalf("the converted document parses to version %s, want %s", set.Version(), res.Set.Version())
		}
	})
}
