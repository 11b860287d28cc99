package policy_test

import (
	"fmt"

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
