package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/internal/adminapi"
)

func topKey(sk string, count, errc, admitted, denied uint64) adminapi.TopKey {
	rule, key, _ := strings.Cut(sk, "/")
	return adminapi.TopKey{StoreKey: sk, Rule: rule, Key: key, Count: count, Error: errc, Admitted: admitted, Denied: denied}
}

// topRegions: acme is denied everywhere, globex in us and ap, initech in
// eu only; eu's summary overcounts.
func topRegions(t *testing.T) (us, eu, ap *fakeRegion) {
	us, eu, ap = newRegion(t), newRegion(t), newRegion(t)
	us.top = adminapi.Top{Region: "us", Replica: "us-0", By: "denied", Window: 60, Keys: []adminapi.TopKey{
		topKey("per-tenant/acme", 2410, 0, 38210, 2410),
		topKey("per-tenant/globex", 300, 0, 9000, 300),
	}}
	eu.top = adminapi.Top{Region: "eu", Replica: "eu-0", By: "denied", Window: 60, Keys: []adminapi.TopKey{
		topKey("per-ip/10.0.0.7", 900, 12, 100, 900),
		topKey("per-tenant/acme", 150, 12, 12000, 150),
	}}
	ap.top = adminapi.Top{Region: "ap", Replica: "ap-0", By: "denied", Window: 60, Keys: []adminapi.TopKey{
		topKey("per-tenant/globex", 700, 0, 50, 700),
		topKey("per-tenant/acme", 5, 0, 600, 5),
	}}
	return us, eu, ap
}

func TestTopMerged(t *testing.T) {
	us, eu, ap := topRegions(t)
	out, errOut, code := ration(t, "top", "-admin", admins(us, eu, ap))
	if code != exitOK || errOut != "" {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	golden(t, "top", out, `top 10 by denied over the last 1m, every rule, from us, eu, ap

RANK  STORE KEY          RULE        COUNT     us    eu   ap   ADMITTED  DENIED
1     per-tenant/acme    per-tenant  2565 ±12  2410  150  5    50810     2565
2     per-tenant/globex  per-tenant  1000      300   -    700  9050      1000
3     per-ip/10.0.0.7    per-ip      900 ±12   -     900  -    100       900

notes:
  ± the summaries' estimates may exceed the true count by at most this much
  - not in that region's top 10: counted as 0
`)
	for _, r := range []*fakeRegion{us, eu, ap} {
		if got := r.requests(); len(got) != 1 || got[0].path != "/v1/top" || got[0].query != "by=denied&n=10" {
			t.Errorf("%s was asked %+v", r.top.Region, got)
		}
	}

	// -n keeps the largest; -rule and -by are passed on.
	for _, r := range []*fakeRegion{us, eu, ap} {
		r.top.By, r.top.Rule = "demand", "per-tenant"
	}
	out, _, code = ration(t, "top", "-admin", admins(us, eu, ap), "-n", "1", "-by", "demand", "-rule", "per-tenant", "-o", "json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, out)
	}
	var got topJSON
	decode(t, out, &got)
	want := []mergedKey{{Rank: 1, TopKey: adminapi.TopKey{StoreKey: "per-tenant/acme", Rule: "per-tenant", Key: "acme", Count: 2565, Error: 12, Admitted: 50810, Denied: 2565},
		Regions: map[string]uint64{"us": 2410, "eu": 150, "ap": 5}}}
	if d := cmp.Diff(want, got.Keys); d != "" {
		t.Errorf("-n 1 -o json keys (-want +got):\n%s", d)
	}
	if got.By != "demand" || got.Rule != "per-tenant" || got.N != 1 || len(got.Regions) != 3 || got.Regions[1].Admin != eu.addr() ||
		len(got.Regions[1].Keys) != 2 || len(got.Errors) != 0 {
		t.Errorf("-o json: %+v", got)
	}
	if q := us.requests()[1].query; q != "by=demand&n=1&rule=per-tenant" {
		t.Errorf("asked %q", q)
	}
}

// TestTopOneRegionDown: the others are merged, the error is reported.
func TestTopOneRegionDown(t *testing.T) {
	us, _, _ := topRegions(t)
	down := downAddr(t)
	out, errOut, code := ration(t, "top", "-admin", down+","+us.addr())
	if code != exitUnreachable {
		t.Fatalf("exit %d, want %d", code, exitUnreachable)
	}
	contains(t, "stdout", out, "from us\n", "1     per-tenant/acme    per-tenant  2410   2410  38210")
	contains(t, "stderr", errOut, down+": dial tcp")

	out, _, _ = ration(t, "top", "-admin", down+","+us.addr(), "-o", "json")
	var got topJSON
	decode(t, out, &got)
	if got.Exit != exitUnreachable || len(got.Keys) != 2 || got.Errors[down] == "" {
		t.Errorf("-o json: %+v", got)
	}
}

// TestTopTwoReplicas: two answers from one region get a column each.
func TestTopTwoReplicas(t *testing.T) {
	a, b := newRegion(t), newRegion(t)
	a.top = adminapi.Top{Region: "us", Replica: "us-0", By: "denied", Window: 60, Keys: []adminapi.TopKey{topKey("r/k", 3, 0, 0, 3)}}
	b.top = adminapi.Top{Region: "us", Replica: "us-1", By: "denied", Window: 60, Keys: []adminapi.TopKey{topKey("r/k", 4, 0, 0, 4)}}
	out, _, code := ration(t, "top", "-admin", admins(a, b))
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	contains(t, "stdout", out, "COUNT  us/us-0  us/us-1", "1     r/k        r     7      3        4")
}
