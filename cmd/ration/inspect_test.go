package main

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/internal/adminapi"
)

// acme is per-tenant/acme as region (replica region-0) answers it; the
// exchange's view is set by the test.
func acme(region string, tokens, rate, share float64, admitted, denied uint64) adminapi.Key {
	return adminapi.Key{
		Region: region, Replica: region + "-0", StoreKey: "per-tenant/acme", Rule: "per-tenant", Key: "acme",
		Scope: "global", Algorithm: "token_bucket", Limit: 1000, Period: 1,
		Bucket: &adminapi.Bucket{Tokens: tokens, Rate: rate, Capacity: rate, Share: share},
		Recent: adminapi.Recent{Window: 60, Admitted: admitted, Denied: denied, Tracked: true},
	}
}

func view(self string, shares map[string][3]float64) *adminapi.Exchange {
	x := &adminapi.Exchange{}
	for _, r := range []string{"us", "eu", "ap"} {
		s := shares[r]
		x.Regions = append(x.Regions, adminapi.RegionShare{Region: r, Self: r == self, Share: s[0], Demand: s[1], ReportAge: s[2]})
	}
	return x
}

// threeRegions serves per-tenant/acme: us runs its exchange, eu too (one
// share heard differently), ap's answer comes from a replica that does
// not.
func threeRegions(t *testing.T) (us, eu, ap *fakeRegion) {
	us, eu, ap = newRegion(t), newRegion(t), newRegion(t)
	k := acme("us", 120.5, 654, 0.654, 38210, 2410)
	k.Exchange = view("us", map[string][3]float64{"us": {0.654, 900, 0}, "eu": {0.224, 200.4, 0.8}, "ap": {0.122, 100, 1.1}})
	us.keys[k.StoreKey] = k
	k = acme("eu", 3, 224, 0.224, 12000, 0)
	k.Exchange = view("eu", map[string][3]float64{"us": {0.654, 900, 0.7}, "eu": {0.224, 200, 0}, "ap": {0.130, 100, 0.9}})
	k.DryFor = 0.25
	eu.keys[k.StoreKey] = k
	k = acme("ap", 0, 122, 0.122, 0, 0)
	k.Replica = "ap-1"
	k.Recent.Tracked = false
	k.Note = "not the exchange's holder replica (ap-0 holds it)"
	ap.keys[k.StoreKey] = k
	return us, eu, ap
}

func TestInspectTable(t *testing.T) {
	us, eu, ap := threeRegions(t)
	out, errOut, code := ration(t, "inspect", "per-tenant/acme", "-admin", admins(us, eu, ap))
	if code != exitOK || errOut != "" {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	golden(t, "inspect", out, `per-tenant/acme: rule per-tenant, global token_bucket, 1000 per 1s
exchange: as us (us-0) hears it

REGION  REPLICA  TOKENS/CAP  RATE/s  APPLIED  SHARE   DEMAND/s  REPORT AGE  ADMITTED  DENIED  DRY
us      us-0     120.5/654   654     65.4%    65.4%   900       self        38210     2410    -
eu      eu-0     3/224       224     22.4%    22.4%   200.4     0.8s        12000     0       0.2s
ap      ap-1     0/122       122     12.2%    12.2%*  100       1.1s        -         -       -

notes:
  ADMITTED and DENIED: tokens over the last 1m
  * views differ: eu (eu-0) hears ap 13.0%
  ap: too few requests in the last 1m to be tracked
  ap: not the exchange's holder replica (ap-0 holds it)
`)
}

// TestInspectOneRegionDown: the others are printed, the error is on
// stderr, and the exit status says a region could not be asked.
func TestInspectOneRegionDown(t *testing.T) {
	us, _, _ := threeRegions(t)
	down := downAddr(t)
	out, errOut, code := ration(t, "inspect", "-rule", "per-tenant", "acme", "-admin", us.addr()+","+down)
	if code != exitUnreachable {
		t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, exitUnreachable, out, errOut)
	}
	contains(t, "stdout", out, "us      us-0", "eu      -", "ap      -")
	contains(t, "stderr", errOut, "ration: "+down+": dial tcp "+down+": connect: connection refused")

	var v inspectJSON
	out, _, code = ration(t, "inspect", "per-tenant/acme", "-admin", us.addr()+","+down, "-o", "json")
	decode(t, out, &v)
	if code != exitUnreachable || v.Exit != exitUnreachable || len(v.Regions) != 1 || !strings.Contains(v.Errors[down], "connection refused") {
		t.Errorf("exit %d, -o json: %+v", code, v)
	}
}

func TestInspectJSON(t *testing.T) {
	us, eu, ap := threeRegions(t)
	out, _, code := ration(t, "inspect", "per-tenant/acme", "-admin", admins(us, eu, ap), "-o", "json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, out)
	}
	var got inspectJSON
	decode(t, out, &got)
	want := inspectJSON{StoreKey: "per-tenant/acme", Errors: map[string]string{}, Regions: []keyJSON{
		{Admin: us.addr(), Key: us.keys["per-tenant/acme"]},
		{Admin: eu.addr(), Key: eu.keys["per-tenant/acme"]},
		{Admin: ap.addr(), Key: ap.keys["per-tenant/acme"]},
	}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("-o json (-want +got):\n%s", d)
	}
	// The document's shape, as scripts read it.
	contains(t, "-o json", out, `"store_key": "per-tenant/acme"`, `"admin": "`+us.addr()+`"`, `"errors": {}`, `"exit": 0`, `"report_age_seconds": 0.8`)
}

// TestInspectEscapes: a store key is one path segment, whatever it holds.
func TestInspectEscapes(t *testing.T) {
	r := newRegion(t)
	for _, tc := range []struct {
		args []string
		sk   string
	}{
		{[]string{"per-tenant/acme"}, "per-tenant/acme"},
		{[]string{"-rule", "per-route", "GET /api/v1"}, "per-route/GET /api/v1"},
		{[]string{"per-user/jürgen@例え.jp"}, "per-user/jürgen@例え.jp"},
		{[]string{"per-x/a%2Fb?c#d"}, "per-x/a%2Fb?c#d"},
	} {
		k := acme("us", 1, 1, 1, 0, 0)
		k.StoreKey = tc.sk
		r.keys[tc.sk] = k
		out, errOut, code := ration(t, append([]string{"inspect", "-admin", r.addr()}, tc.args...)...)
		if code != exitOK {
			t.Errorf("%q: exit %d\n%s%s", tc.sk, code, out, errOut)
			continue
		}
		got := r.requests()
		last := got[len(got)-1]
		if want := adminapi.PathKey + url.PathEscape(tc.sk); last.path != want || last.storeKey != tc.sk || last.query != "" {
			t.Errorf("asked %+v, want path %s and store key %q", last, want, tc.sk)
		}
	}
}

// TestInspectUnknownRule: a region that answers 404 (no such rule) is a
// refusal, exit 1, with the region's message.
func TestInspectUnknownRule(t *testing.T) {
	r := newRegion(t)
	out, errOut, code := ration(t, "inspect", "nope/acme", "-admin", r.addr())
	if code != exitRefused || out != "" {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	golden(t, "stderr", errOut, "ration: "+r.addr()+": 404 Not Found: no rule named nope\n")
}

// TestInspectWrongKey: an answer about another key is refused.
func TestInspectWrongKey(t *testing.T) {
	r := newRegion(t)
	r.keys["per-tenant/acme"] = acme("us", 1, 1, 1, 0, 0)
	r.keys["per-tenant/acme"] = func() adminapi.Key { k := r.keys["per-tenant/acme"]; k.StoreKey = "per-tenant"; return k }()
	_, errOut, code := ration(t, "inspect", "per-tenant/acme", "-admin", r.addr())
	if code != exitUnreachable || !strings.Contains(errOut, `it is about key "per-tenant", not "per-tenant/acme"`) {
		t.Errorf("exit %d, stderr %s", code, errOut)
	}
}

// TestInspectUnderPrefix: an -admin URL with a path (a proxy in front of
// regiond) puts the API's paths under it, the key still escaped.
func TestInspectUnderPrefix(t *testing.T) {
	r := newRegion(t)
	k := acme("us", 1, 1, 1, 0, 0)
	k.StoreKey = "per-route/GET /a b"
	r.keys[k.StoreKey] = k
	proxy := newHandlerRegion(t, http.StripPrefix("/ration/us", r.mux()))
	if out, errOut, code := ration(t, "inspect", "-admin", "http://"+proxy+"/ration/us/", k.StoreKey); code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if got := r.requests(); len(got) != 1 || got[0].storeKey != k.StoreKey || got[0].path != "/v1/keys/per-route%2FGET%20%2Fa%20b" {
		t.Errorf("asked %+v", got)
	}
}

// TestInspectNotes: what the table cannot show goes in the notes: a key
// without a bucket, regions enforcing different quotas, a held key, a
// global key no answer carried the exchange's view of.
func TestInspectNotes(t *testing.T) {
	us, eu := newRegion(t), newRegion(t)
	k := acme("us", 10, 500, 0.5, 5, 1)
	k.Exchange = view("us", map[string][3]float64{"us": {0.5, 10, 0}, "eu": {0.5, 0, 0.5}, "ap": {0, 0, -1}})
	k.Exchange.Held = true
	us.keys[k.StoreKey] = k
	k = acme("eu", 0, 0, 0, 0, 0)
	k.Bucket, k.Limit = nil, 500
	eu.keys[k.StoreKey] = k
	out, _, code := ration(t, "inspect", "per-tenant/acme", "-admin", admins(us, eu))
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	golden(t, "inspect", out, `per-tenant/acme: rule per-tenant, global token_bucket, 1000 per 1s
exchange: as us (us-0) hears it; held (regions define the rule differently: shares stay where they are)

REGION  REPLICA  TOKENS/CAP  RATE/s  APPLIED  SHARE  DEMAND/s  REPORT AGE  ADMITTED  DENIED  DRY
us      us-0     10/500      500     50.0%    50.0%  10        self        5         1       -
eu      eu-0     -           -       -        50.0%  0         0.5s        0         0       -
ap      -        -           -       -        0.0%   0         never       -         -       -

notes:
  ADMITTED and DENIED: tokens over the last 1m
  the regions enforce different quotas (the stricter holds while they disagree): us: global token_bucket 1000 per 1s; eu: global token_bucket 500 per 1s
  eu: no bucket in the store (never leased, or expired)
`)

	delete(us.keys, "per-tenant/acme")
	out, _, _ = ration(t, "inspect", "per-tenant/acme", "-admin", admins(eu, us))
	contains(t, "stdout", out, "no answer carried the exchange's view: ask a region's holder replica (ration status shows it)")
}
