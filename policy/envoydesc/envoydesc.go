// Package envoydesc maps Envoy's rate limit descriptors to ration's: the
// one mapping that Envoy's RLS adapter (lease/agent/envoyrls) and the RLQS
// server (lease/rlqs) share, so that a request limited either way meets the
// same rule and key. It imports neither, so that both can use it.
package envoydesc

import (
	"errors"
	"fmt"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ration-dev/ration/policy"
)

// DefaultDomainKey is the descriptor key of Envoy's domain.
const DefaultDomainKey = "domain"

// Append appends to ds the ration descriptors of one Envoy descriptor's
// entries: the request's domain under domainKey (none when domainKey is
// "-" or domain is empty; "" means DefaultDomainKey), then each entry in
// order. No entries, or an entry with an empty key, is an error.
func Append(ds []policy.Descriptor, domainKey, domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry) ([]policy.Descriptor, error) {
	if len(entries) == 0 {
		return nil, errors.New("no entries")
	}
	if domainKey == "" {
		domainKey = DefaultDomainKey
	}
	if domainKey != "-" && domain != "" {
		ds = append(ds, policy.Descriptor{Key: domainKey, Value: domain})
	}
	for j, e := range entries {
		if e.GetKey() == "" {
			return nil, fmt.Errorf("entries[%d]: empty key", j)
		}
		ds = append(ds, policy.Descriptor{Key: e.GetKey(), Value: e.GetValue()})
	}
	return ds, nil
}
