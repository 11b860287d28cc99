package codec

import (
	"errors"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// FuzzDecode feeds arbitrary bytes to the decoder, the assembler and a
// region.State: nothing may panic, and whatever is not dropped must be a
// report that region accepts or rejects with one of its sentinels. Seeds
// are in testdata/fuzz/FuzzDecode (a good report, a part of a split one,
// truncated, bit-flipped, wrong version, malformed rows). Each input is
// also tried as the body of a valid envelope, so that the checksum does not
// keep the fuzzer out of the part decoder.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, msg []byte) {
		checkDecode(t, msg)
		checkDecode(t, appendEnvelope(nil, msg))
		if body, err := openEnvelope(msg); err == nil {
			checkDecode(t, appendEnvelope(nil, body))
		}
	})
}

func checkDecode(t *testing.T, msg []byte) {
	t.Helper()
	lim := Limits{MaxMessageBytes: 1 << 20}
	p, err := DecodePart(msg, lim)
	if err != nil {
		if _, ok := ReasonOf(err); !ok || !errors.Is(err, ErrDropped) {
			t.Fatalf("DecodePart: an unclassified error %v", err)
		}
		return
	}
	if p.Count < 1 || p.Index >= p.Count || len(p.Keys) > p.KeysTotal {
		t.Fatalf("DecodePart accepted part %d of %d with %d of %d keys", p.Index, p.Count, len(p.Keys), p.KeysTotal)
	}
	now := time.Unix(1_700_000_000, 0)
	a := NewAssembler(AssemblerConfig{})
	r, err := a.Add(now, p)
	if err != nil {
		if _, ok := ReasonOf(err); !ok {
			t.Fatalf("Add: an unclassified error %v", err)
		}
		return
	}
	if r == nil {
		return
	}
	st, err := region.New(region.Config{Self: "eu", Regions: []string{"ap", "eu", "us"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Receive(now, *r); err != nil {
		if _, ok := ReasonOf(err); !ok {
			t.Fatalf("Receive: an unclassified error %v", err)
		}
		return
	}
	// An accepted report must survive an epoch.
	_ = st.Epoch(now.Add(time.Second))
}
