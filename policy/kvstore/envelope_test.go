package kvstore

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	r := Revision{
		Op: OpRollback, Author: "alice", ClaimedAuthor: "al", Message: "back to 3", Version: "0123456789abcdef",
		Diff: "@@ -1 +1 @@\n-a\n+b\n", FromRevision: 3, Time: time.Date(2026, 12, 1, 10, 0, 0, 5, time.UTC),
		Source: []byte("rules: []\n"),
	}
	v, err := r.encode()
	if err != nil {
		t.Fatal(err)
	}
	var got Revision
	if err := got.decode(v, false); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(r, got); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value string
		raw   bool
		err   error
	}{
		{"yaml", "rules: []\n", true, nil},
		{"flow yaml", "{rules: []}", true, nil},
		{"json policy", `{"rules": []}`, true, nil},
		{"empty", "", true, nil},
		{"format not a string", `{"format": 1}`, true, nil},
		{"newer format", `{"format": "ration-policy/v2"}`, false, ErrFormat},
		{"unknown op", `{"format": "ration-policy/v1", "op": "merge", "time": "2026-01-01T00:00:00Z"}`, false, ErrFormat},
		{"bad time", `{"format": "ration-policy/v1", "op": "push", "time": "yesterday"}`, false, ErrFormat},
		{"bad field type", `{"format": "ration-policy/v1", "op": "push", "time": "2026-01-01T00:00:00Z", "from_revision": "x"}`, false, ErrFormat},
		{"v1", `{"format": "ration-policy/v1", "op": "push", "time": "2026-01-01T00:00:00+02:00", "policy": "rules: []", "extra": 1}`, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Revision
			err := r.decode([]byte(tc.value), false)
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Fatalf("got %v, want %v", err, tc.err)
			}
			if err == nil && r.Raw != tc.raw {
				t.Errorf("raw: got %v, want %v", r.Raw, tc.raw)
			}
			if err == nil && tc.raw && string(r.Source) != tc.value {
				t.Errorf("raw source %q, want the value", r.Source)
			}
		})
	}
}

// FuzzDecode: decoding never panics, and an envelope that decodes
// encodes to one that decodes to the same revision.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		"rules: []\n",
		`{"format":"ration-policy/v1","author":"a","claimed_author":"b","time":"2026-01-01T00:00:00Z","message":"m","op":"push","from_revision":2,"version":"v","diff":"d","policy":"rules: []\n"}`,
		`{"format":"ration-policy/v1","op":"unstage","time":"2026-01-01T00:00:00.5-07:00"}`,
		`{"format":"ration-policy/v9"}`,
		`{"format":"ration-policy/v1","op":"push","time":"0000-01-01T00:00:00+01:00"}`,
	} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, value []byte, deleted bool) {
		var r Revision
		if err := r.decode(value, deleted); err != nil {
			return
		}
		if r.Raw {
			if !deleted && string(r.Source) != string(value) {
				t.Fatalf("raw source %q, want the value %q", r.Source, value)
			}
			return
		}
		v, err := r.encode()
		if err != nil {
			t.Fatalf("a decoded revision does not encode: %v", err)
		}
		var again Revision
		if err := again.decode(v, deleted); err != nil {
			t.Fatalf("re-encoded %s does not decode: %v", v, err)
		}
		if d := cmp.Diff(r, again); d != "" {
			t.Fatalf("round trip of %q (-first +second):\n%s", value, d)
		}
	})
}
