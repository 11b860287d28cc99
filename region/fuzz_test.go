package region_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/region"
)

// FuzzReceive damages one field of a valid report and checks that Receive
// either rejects it with a documented sentinel error, changing nothing, or
// accepts it, after which the next plan still writes shares in [0, PPM].
func FuzzReceive(f *testing.F) {
	f.Add(uint8(0), uint8(0), int64(0), uint64(1))
	f.Add(uint8(1), uint8(2), int64(-1), uint64(1))
	f.Add(uint8(2), uint8(0), int64(region.PPM+1), uint64(1))
	f.Add(uint8(5), uint8(1), int64(1<<60), uint64(0))
	f.Fuzz(func(t *testing.T, field, col uint8, value int64, epochDelta uint64) {
		a, _, now, fromB := twoRegions(t)
		rep := cloneReport(fromB)
		rep.Epoch += epochDelta
		k := &rep.Keys[0]
		c := int(col) % len(rep.Regions)
		switch field % 10 {
		case 0:
			k.Row[c] = value
		case 1:
			k.Demand = value
		case 2:
			k.SharePPM = value
		case 3:
			k.Base = value
		case 4:
			k.Generation = uint64(value)
		case 5:
			k.In = make([]int64, len(rep.Regions))
			k.In[c] = value
		case 6:
			k.Taken = make([]int64, len(rep.Regions))
			k.Taken[c] = value
		case 7:
			k.Exits = []region.Exit{{Generation: uint64(value), Row: make([]int64, len(rep.Regions)), In: make([]int64, len(rep.Regions))}}
		case 8:
			k.Row = k.Row[:c]
		case 9:
			k.Settled = make([]uint64, len(rep.Regions))
			k.Settled[c] = uint64(value)
		}
		before := a.Snapshot()
		err := a.Receive(now, rep)
		if err != nil {
			for _, sentinel := range []error{region.ErrMalformed, region.ErrStale, region.ErrRegressed, region.ErrUnknownRegion} {
				if errors.Is(err, sentinel) {
					if diff := cmp.Diff(before, a.Snapshot()); diff != "" {
						t.Fatalf("rejected report (%v) changed the state (-before +after):\n%s", err, diff)
					}
					return
				}
			}
			t.Fatalf("Receive: got error %v, want one of the sentinels", err)
		}
		p := a.Epoch(now.Add(time.Second))
		for _, list := range [][]region.ShareChange{p.Lower, p.Raise} {
			for _, ch := range list {
				if ch.SharePPM < 0 || ch.SharePPM > region.PPM {
					t.Fatalf("plan after an accepted report: share %d of %s, want in [0, %d]", ch.SharePPM, ch.Key, region.PPM)
				}
			}
		}
	})
}

// FuzzResendRequest checks that ParseResendRequest never panics, and that
// what it accepts prints back to the same request.
func FuzzResendRequest(f *testing.F) {
	f.Add("x/1700000000/eu/eu-0")
	f.Add("t/1/ap/host/with/slashes")
	f.Add("x/0/eu/a")
	f.Fuzz(func(t *testing.T, s string) {
		q, err := region.ParseResendRequest(s)
		if err != nil {
			return
		}
		back, err := region.ParseResendRequest(q.String())
		if err != nil || back != q {
			t.Fatalf("%q parsed to %+v, which prints to %q and parses to %+v, %v", s, q, q.String(), back, err)
		}
	})
}
