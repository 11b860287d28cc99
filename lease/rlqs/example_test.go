package rlqs_test

import (
	"fmt"

	"github.com/ration-dev/ration/lease/rlqs"
	"github.com/ration-dev/ration/policy"
)

// ExampleResolve maps an Envoy quota bucket to the rule and key whose
// regional bucket its assignments are leased from: the filter's domain
// under "domain", then the bucket id's pairs, as Envoy's RLS adapter maps
// a descriptor.
func ExampleResolve() {
	pol, err := policy.Parse("example", []byte(`rules:
  - name: edge-tenant
    match: { domain: edge }
    key: [tenant]
    limit: 300
`))
	if err != nil {
		panic(err)
	}
	r, key, err := rlqs.Resolve(pol, "domain", "edge", map[string]string{"tenant": "acme", "route": "/v1"})
	fmt.Println(r.Name, key, err)
	_, _, err = rlqs.Resolve(pol, "domain", "other", map[string]string{"tenant": "acme"})
	fmt.Println(err)
	// Output:
	// edge-tenant tenant=acme <nil>
	// rlqs: no rule applies
}
