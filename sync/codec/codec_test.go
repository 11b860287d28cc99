package codec

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/ration-dev/ration/region"
	syncv1 "github.com/ration-dev/ration/sync/v1"
)

// seed returns a random seed and logs it, so that a failure can be
// replayed by putting the printed value in place of the call.
func seed(t testing.TB) uint64 {
	s := rand.Uint64()
	t.Logf("seed %d", s)
	return s
}

// randomReport builds a report with n keys over the given regions. It need
// not be valid for region: the codec carries what it is given.
func randomReport(rng *rand.Rand, regions []string, n int, exchange bool) region.Report {
	r := region.Report{
		Region:   regions[rng.IntN(len(regions))],
		Replica:  fmt.Sprintf("replica-%d", rng.IntN(3)),
		Epoch:    rng.Uint64N(1 << 40),
		SentAt:   time.Unix(1_700_000_000, rng.Int64N(1e9)),
		Exchange: exchange,
		Regions:  regions,
	}
	if rng.IntN(2) == 0 { // a delta report
		r.Refresh, r.Since = 1+rng.Uint32N(3600), rng.Uint64N(r.Epoch+1)
		r.RefreshFrom, r.RefreshCount = rng.Uint32N(region.RefreshBuckets), rng.Uint32N(region.RefreshBuckets+1)
		r.Prev, r.Resent = rng.Uint64N(r.Epoch+1), rng.Uint64N(r.Epoch+1)
		for j := rng.IntN(3); j > 0; j-- {
			r.Resend = append(r.Resend, region.ResendRequest{Region: regions[0], Replica: "replica-0/x", Exchange: j%2 == 0, From: 1 + rng.Uint64N(1<<40)}.String())
		}
	}
	if rng.IntN(2) == 0 {
		r.Policy = fmt.Sprintf("rev-%d", rng.IntN(100))
		for j := rng.IntN(4); j > 0; j-- {
			r.Rules = append(r.Rules, region.RuleDef{Name: fmt.Sprintf("rule-%d", j), Fingerprint: rng.Uint64(), FixedWindow: rng.IntN(2) == 0,
				Limit: rng.Int64N(1 << 40), Period: time.Duration(rng.Int64N(1 << 45)), Burst: rng.Int64N(1 << 40), Cost: rng.Int64N(100)})
		}
	}
	row := func() []int64 {
		if rng.IntN(3) == 0 {
			return nil
		}
		v := make([]int64, len(regions))
		for i := range v {
			v[i] = rng.Int64N(2_000_000)
		}
		if rng.IntN(4) != 0 { // as region writes it: nothing to itself
			v[slices.Index(regions, r.Region)] = 0
		}
		return v
	}
	for i := 0; i < n; i++ {
		k := region.KeyReport{
			Key:          randomName(rng, i),
			Generation:   rng.Uint64N(1 << 35),
			Base:         rng.Int64N(2_000_000) - 1_000_000,
			Row:          row(),
			Taken:        row(),
			In:           row(),
			InTaken:      row(),
			Tokens:       row(),
			TokensWindow: rng.Int64N(2) * rng.Int64N(1<<52),
			SharePPM:     rng.Int64N(1_000_001),
			Demand:       rng.Int64N(1 << 20),
			Granted:      rng.Int64N(1 << 20),
		}
		if rng.IntN(4) == 0 { // a tally-only or empty entry's share (V3)
			k.Generation = 0
		}
		if row := row(); row != nil && rng.IntN(3) == 0 {
			for _, v := range row {
				k.Settled = append(k.Settled, uint64(v))
			}
		}
		for e := rng.IntN(3); e > 0; e-- {
			k.Exits = append(k.Exits, region.Exit{Generation: rng.Uint64N(1 << 30), Row: row(), Taken: row(), In: row(), InTaken: row()})
		}
		r.Keys = append(r.Keys, k)
	}
	return r
}

// randomName is the name of key i of a random report: names that V3 writes
// as steps of their trailing number (ids in order, out of order, at the
// edges of their digits, longer than a step takes) and names it does not.
func randomName(rng *rand.Rand, i int) string {
	switch rng.IntN(8) {
	case 0:
		return fmt.Sprintf("per-user/user=%07d", rng.IntN(10_000_000))
	case 1:
		return fmt.Sprintf("per-user/user=%03d", []int{0, 1, 9, 99, 100, 998, 999}[rng.IntN(7)])
	case 2:
		return fmt.Sprintf("id=%d%019d", rng.IntN(10), rng.Uint64N(1e19))
	case 3:
		return fmt.Sprint(rng.IntN(30))
	case 4:
		return fmt.Sprintf("k%dx", rng.IntN(30))
	}
	return fmt.Sprintf("rule-%d/tenant=%d", rng.IntN(4), i)
}

// decodeAll decodes msgs in the given order into one assembler and returns
// the report they complete.
func decodeAll(t *testing.T, a *Assembler, now time.Time, msgs [][]byte) *region.Report {
	t.Helper()
	var got *region.Report
	for i, m := range msgs {
		p, err := DecodePart(m, Limits{})
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		r, err := a.Add(now, p)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if r != nil {
			if got != nil {
				t.Fatalf("message %d completed a second report", i)
			}
			got = r
		}
	}
	return got
}

// TestRoundTripSplit encodes random reports at random message sizes,
// delivers the parts in random order and checks that the report comes back
// whole and that no message exceeds its size.
func TestRoundTripSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 1))
	now := time.Unix(1_700_000_100, 0)
	for i := 0; i < 200; i++ {
		regions := []string{"ap", "eu", "us", "zz"}[:1+rng.IntN(4)]
		want := randomReport(rng, regions, rng.IntN(60), rng.IntN(2) == 0)
		max := 600 + rng.IntN(4000)
		msgs, err := EncodeReport(&want, rng.Uint64(), max)
		if err != nil {
			t.Fatalf("report %d: EncodeReport: %v", i, err)
		}
		for j, m := range msgs {
			if len(m) > max {
				t.Fatalf("report %d: message %d is %d bytes, want at most %d", i, j, len(m), max)
			}
		}
		rng.Shuffle(len(msgs), func(a, b int) { msgs[a], msgs[b] = msgs[b], msgs[a] })
		got := decodeAll(t, NewAssembler(AssemblerConfig{}), now, msgs)
		if got == nil {
			t.Fatalf("report %d: %d parts did not complete it", i, len(msgs))
		}
		if diff := cmp.Diff(&want, got); diff != "" {
			t.Fatalf("report %d in %d parts (-want +got):\n%s", i, len(msgs), diff)
		}
	}
}

func TestEncodeTooLarge(t *testing.T) {
	r := region.Report{Region: "eu", Replica: "0", Keys: []region.KeyReport{{Key: string(make([]byte, 2000))}}}
	if _, err := EncodeReport(&r, 1, 1000); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
	if _, err := EncodeReport(&r, 1, 10); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("tiny message: got %v, want ErrTooLarge", err)
	}
}

// part marshals a hand-made part in an envelope.
func part(p *syncv1.Part) []byte {
	b, err := proto.Marshal(p)
	if err != nil {
		panic(err)
	}
	return appendEnvelope(nil, b)
}

func header(epoch uint64, id uint64, i, n, total uint32) *syncv1.Part {
	return &syncv1.Part{Region: "eu", Replica: "0", Epoch: epoch, Regions: []string{"eu", "us"}, ReportId: id, Part: i, Parts: n, KeysTotal: total}
}

func wantReason(t *testing.T, what string, err error, want Reason) {
	t.Helper()
	got, ok := ReasonOf(err)
	if !ok || got != want {
		t.Errorf("%s: got %v (reason %q), want reason %q", what, err, got, want)
	}
	if !errors.Is(err, ErrDropped) && err != nil {
		var de *DropError
		if errors.As(err, &de) {
			t.Errorf("%s: a DropError that does not wrap ErrDropped", what)
		}
	}
}

// TestDecodeHostile feeds messages that must be dropped, each for its
// reason, and never applied.
func TestDecodeHostile(t *testing.T) {
	good := part(&syncv1.Part{Region: "eu", Replica: "0", Epoch: 5, Regions: []string{"eu", "us"}, ReportId: 1, Parts: 1, KeysTotal: 1,
		Keys: []*syncv1.Key{{Key: "r/k", Generation: 3, Row: []int64{0, 10}, SharePpm: 400_000, Demand: 7}}})
	if _, err := DecodePart(good, Limits{}); err != nil {
		t.Fatalf("the good message: %v", err)
	}
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)-3] ^= 0x40
	v4 := append([]byte{0x08, 0x04}, good[2:]...) // version 4, not known yet
	for _, tc := range []struct {
		name string
		msg  []byte
		lim  Limits
		want Reason
	}{
		{"empty", nil, Limits{}, ReasonVersion},
		{"garbage", []byte("hello, world"), Limits{}, ReasonCorrupt},
		{"bit flip", flipped, Limits{}, ReasonCorrupt},
		{"version 4", v4, Limits{}, ReasonVersion},
		{"oversized", good, Limits{MaxMessageBytes: 10}, ReasonOversized},
		{"no body", good[:7], Limits{}, ReasonCorrupt},
		{"part out of range", part(header(5, 1, 3, 2, 0)), Limits{}, ReasonInconsistent},
		{"zero parts", part(header(5, 1, 0, 0, 0)), Limits{}, ReasonInconsistent},
		{"too many parts", part(header(5, 1, 0, 5000, 0)), Limits{}, ReasonOversized},
		{"too many keys", part(header(5, 1, 0, 1, 1<<30)), Limits{}, ReasonOversized},
		{"more keys than announced", part(&syncv1.Part{Region: "eu", Replica: "0", Parts: 1, KeysTotal: 0, Keys: []*syncv1.Key{{Key: "a"}}}), Limits{}, ReasonInconsistent},
		{"no region", part(&syncv1.Part{Replica: "0", Parts: 1}), Limits{}, ReasonInconsistent},
		{"no replica", part(&syncv1.Part{Region: "eu", Parts: 1}), Limits{}, ReasonInconsistent},
		{"long key", part(&syncv1.Part{Region: "eu", Replica: "0", Parts: 1, KeysTotal: 1, Keys: []*syncv1.Key{{Key: string(make([]byte, 5000))}}}), Limits{}, ReasonInconsistent},
		{"65 regions", part(&syncv1.Part{Region: "eu", Replica: "0", Parts: 1, Regions: make([]string, 65)}), Limits{}, ReasonInconsistent},
		{"body not a part", appendEnvelope(nil, []byte{0xff, 0xff, 0xff}), Limits{}, ReasonCorrupt},
	} {
		_, err := DecodePart(tc.msg, tc.lim)
		wantReason(t, tc.name, err, tc.want)
	}
	// Every truncation of a good message is dropped, as truncated or
	// corrupt (a cut between fields leaves no body or a bad checksum).
	for n := 0; n < len(good); n++ {
		_, err := DecodePart(good[:n], Limits{})
		if r, ok := ReasonOf(err); !ok || (r != ReasonTruncated && r != ReasonCorrupt && r != ReasonVersion) {
			t.Errorf("truncated to %d bytes: got %v", n, err)
		}
	}
}

// TestAssemblerDrops checks duplicate, replayed, inconsistent, incomplete
// and overflowing parts.
func TestAssemblerDrops(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	dec := func(p *syncv1.Part) *Part {
		t.Helper()
		d, err := DecodePart(part(p), Limits{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	withKeys := func(p *syncv1.Part, n int) *syncv1.Part {
		for i := 0; i < n; i++ {
			p.Keys = append(p.Keys, &syncv1.Key{Key: fmt.Sprintf("r/%d-%d", p.Part, i)})
		}
		return p
	}
	a := NewAssembler(AssemblerConfig{Timeout: time.Second, MaxPendingBytes: 1000})

	// A single-part report, then the same again, then an older one.
	if r, err := a.Add(now, dec(withKeys(header(10, 1, 0, 1, 2), 2))); err != nil || r == nil || len(r.Keys) != 2 {
		t.Fatalf("single part: got %v, %v; want a report of 2 keys", r, err)
	}
	_, err := a.Add(now, dec(withKeys(header(10, 1, 0, 1, 2), 2)))
	wantReason(t, "same report again", err, ReasonDuplicate)
	_, err = a.Add(now, dec(header(9, 7, 0, 1, 0)))
	wantReason(t, "older report", err, ReasonReplayed)
	_, err = a.Add(now, dec(withKeys(header(11, 2, 0, 1, 3), 2)))
	wantReason(t, "key count mismatch", err, ReasonInconsistent)

	// A three-part report: a duplicate part, a contradicting part, then
	// completion in any order.
	if r, err := a.Add(now, dec(withKeys(header(12, 3, 2, 3, 3), 1))); r != nil || err != nil {
		t.Fatalf("first part: got %v, %v; want nothing yet", r, err)
	}
	_, err = a.Add(now, dec(withKeys(header(12, 3, 2, 3, 3), 1)))
	wantReason(t, "duplicate part", err, ReasonDuplicate)
	_, err = a.Add(now, dec(withKeys(header(13, 3, 0, 3, 3), 1)))
	wantReason(t, "part with another epoch", err, ReasonInconsistent)
	_, err = a.Add(now, dec(withKeys(header(12, 3, 0, 4, 3), 1)))
	wantReason(t, "part with another count", err, ReasonInconsistent)
	if r, err := a.Add(now, dec(withKeys(header(12, 3, 0, 3, 3), 1))); r != nil || err != nil {
		t.Fatalf("second part: got %v, %v", r, err)
	}
	r, err := a.Add(now, dec(withKeys(header(12, 3, 1, 3, 3), 1)))
	if err != nil || r == nil {
		t.Fatalf("last part: got %v, %v; want the report", r, err)
	}
	if diff := cmp.Diff([]string{"r/0-0", "r/1-0", "r/2-0"}, keysOf(r)); diff != "" {
		t.Errorf("keys in part order (-want +got):\n%s", diff)
	}
	if a.PendingBytes() != 0 {
		t.Errorf("got %d pending bytes after completion, want 0", a.PendingBytes())
	}

	// Parts whose report never completes are dropped after the timeout.
	if _, err := a.Add(now, dec(withKeys(header(20, 4, 0, 2, 2), 1))); err != nil {
		t.Fatal(err)
	}
	if n := a.Expire(now.Add(time.Second)); n != 0 {
		t.Errorf("expired %d parts at the timeout, want 0", n)
	}
	if n := a.Expire(now.Add(time.Second + 1)); n != 1 {
		t.Errorf("expired %d parts after the timeout, want 1", n)
	}

	// A full buffer drops new parts.
	big := withKeys(header(30, 5, 0, 2, 200), 100)
	_, err = a.Add(now, dec(big))
	wantReason(t, "part beyond the buffer", err, ReasonOverflow)
}

func keysOf(r *region.Report) []string {
	var ks []string
	for _, k := range r.Keys {
		ks = append(ks, k.Key)
	}
	return ks
}

// TestSnapshotRoundTrip persists a real State's snapshot and restores it.
func TestSnapshotRoundTrip(t *testing.T) {
	regions := []string{"ap", "eu", "us"}
	now := time.Unix(1_700_000_000, 0)
	st, err := region.New(region.Config{Self: "eu", Regions: regions})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		now = now.Add(time.Second)
		st.Observe("r/a", 100, 90)
		st.Observe("r/b", 10, 10)
		p := st.Epoch(now)
		if err := st.Commit(p); err != nil {
			t.Fatal(err)
		}
	}
	want := st.Snapshot()
	b, err := EncodeSnapshot(&want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("snapshot (-want +got):\n%s", diff)
	}
	other, err := region.New(region.Config{Self: "eu", Regions: regions})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Restore(got); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	b[len(b)-1] ^= 1
	if _, err := DecodeSnapshot(b); !errors.Is(err, ErrDropped) {
		t.Errorf("damaged snapshot: got %v, want a drop", err)
	}
}
