package policy_test

import (
	"fmt"
	"time"

	"github.com/ration-dev/ration/policy"
)

func Example() {
	set, err := policy.Parse("rules.yaml", []byte(`
rules:
  - name: requests-per-tenant
    key: [tenant]
    limit: 1000
    burst: 2000
  - name: transfers-per-tenant
    match: { route: /v1/transfers, method: POST }
    key: [tenant]
    limit: 500
    cost: 10
    on_error: closed
`))
	if err != nil {
		fmt.Println(err)
		return
	}

	// Descriptors of one request, in any order.
	ds := []policy.Descriptor{
		{Key: "method", Value: "POST"},
		{Key: "tenant", Value: "acme, inc"},
		{Key: "route", Value: "/v1/transfers"},
	}
	// Reuse both buffers across requests: Match and AppendKey then do not
	// allocate.
	matched := make([]*policy.Rule, 0, 8)
	key := make([]byte, 0, 64)
	for _, r := range set.Match(matched, ds) {
		key = r.AppendKey(key[:0], ds)
		fmt.Printf("%s: key %s, %g tokens/s, cost %d, on_error %s\n", r.Name, key, r.Rate(), r.Cost, r.OnError)
	}

	// A bad document is rejected whole, each problem with file, line and field.
	_, err = policy.Parse("rules.yaml", []byte("rules:\n  - name: x\n    key: [tenant]\n    limit: 0\n    period: 1\n"))
	fmt.Println(err)
	// Output:
	// requests-per-tenant: key tenant=acme%2C%20inc, 1000 tokens/s, cost 1, on_error local
	// transfers-per-tenant: key tenant=acme%2C%20inc, 500 tokens/s, cost 10, on_error closed
	// rules.yaml:4: rules[0].limit: must be > 0
	// rules.yaml:5: rules[0].period: must be a Go duration with a unit, such as "1s" or "500ms" (got integer 1)
}

func ExampleRule_Window() {
	set, err := policy.Parse("rules.yaml", []byte(`
rules:
  - name: daily-per-tenant
    key: [tenant]
    limit: 10000
    algorithm: fixed_window
    period: day
    time_zone: Europe/Berlin
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	r := set.Rule("daily-per-tenant")
	// The day Berlin sets its clocks back has 25 hours.
	now := time.Date(2024, 10, 27, 15, 0, 0, 0, time.UTC)
	start, end := r.Window(now)
	fmt.Printf("%s to %s (%s), resets in %s\n", start.Format(time.RFC3339), end.Format(time.RFC3339), end.Sub(start), end.Sub(now))
	// Boundaries gives a store the windows around now in Unix microseconds.
	b := r.Boundaries(now)
	fmt.Println(time.UnixMicro(b[0]).UTC().Format(time.RFC3339), time.UnixMicro(b[3]).UTC().Format(time.RFC3339))
	// Output:
	// 2024-10-27T00:00:00+02:00 to 2024-10-28T00:00:00+01:00 (25h0m0s), resets in 8h0m0s
	// 2024-10-25T22:00:00Z 2024-10-28T23:00:00Z
}
