package envoydesc_test

import (
	"fmt"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ration-dev/ration/policy/envoydesc"
)

func ExampleAppend() {
	ds, err := envoydesc.Append(nil, "", "edge", []*ratelimitv3.RateLimitDescriptor_Entry{
		{Key: "tenant", Value: "acme"}, {Key: "route", Value: "/v1"}})
	fmt.Println(ds, err)
	_, err = envoydesc.Append(nil, "-", "edge", []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "", Value: "x"}})
	fmt.Println(err)
	// Output:
	// [{domain edge} {tenant acme} {route /v1}] <nil>
	// entries[0]: empty key
}
