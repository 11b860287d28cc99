package rlqs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/policy/envoydesc"
)

// Why a bucket's usage is ignored (the label of the invalid counter).
const (
	badEmptyID    = "empty_bucket_id"
	badEntries    = "too_many_entries"
	badEntry      = "bad_entry"
	badElapsed    = "bad_time_elapsed"
	badCount      = "count_out_of_range"
	badTooMany    = "too_many_buckets"
	badFixed      = "fixed_window_rule"
	badKeyTooLong = "key_too_long"
)

// usage is one bucket's report, checked: requests allowed and denied over
// elapsed (0 when the proxy's whole-second truncation read 0 s).
type usage struct {
	id              string // canonical: keys sorted, length-prefixed
	bucket          map[string]string
	allowed, denied int64
	elapsed         time.Duration
}

// limits bounds what one report may carry.
type limits struct {
	entries  int    // pairs of one bucket id
	entryLen int    // bytes of one key or value
	requests uint64 // allowed + denied of one bucket in one report
}

// decodeUsage checks one BucketQuotaUsage. A bad one returns the reason it
// is ignored (a label of the invalid counter) and changes nothing.
func decodeUsage(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, lim limits) (usage, string) {
	m := u.GetBucketId().GetBucket()
	switch {
	case len(m) == 0:
		return usage{}, badEmptyID
	case len(m) > lim.entries:
		return usage{}, badEntries
	}
	for k, v := range m {
		if k == "" || len(k) > lim.entryLen || len(v) > lim.entryLen {
			return usage{}, badEntry
		}
	}
	var elapsed time.Duration
	if d := u.GetTimeElapsed(); d != nil {
		if err := d.CheckValid(); err != nil || d.GetSeconds() < 0 || d.GetNanos() < 0 || d.GetSeconds() > 1<<32 {
			return usage{}, badElapsed
		}
		elapsed = d.AsDuration()
	}
	a, dn := u.GetNumRequestsAllowed(), u.GetNumRequestsDenied()
	if a > lim.requests || dn > lim.requests || a+dn > lim.requests {
		return usage{}, badCount
	}
	return usage{id: bucketKey(m), bucket: m, allowed: int64(a), denied: int64(dn), elapsed: elapsed}, ""
}

// bucketKey is the canonical identity of a bucket id: its pairs sorted by
// key, each length-prefixed, so that two maps with the same pairs give the
// same key whatever their order and no two different maps collide.
func bucketKey(m map[string]string) string {
	keys := sortedKeys(m)
	n := 0
	for _, k := range keys {
		n += len(k) + len(m[k]) + 2*binary.MaxVarintLen64
	}
	b := make([]byte, 0, n)
	for _, k := range keys {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(m[k])))
		b = append(b, m[k]...)
	}
	return string(b)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ErrNoRule is returned by Resolve when no enforced rule applies to a
// bucket: ration sets no limit on it.
var ErrNoRule = errors.New("rlqs: no rule applies")

// errFixed is Resolve's error for a fixed-window rule, whose window
// boundaries an assignment's whole-second TTL cannot respect.
var errFixed = errors.New("rlqs: fixed-window rules are served by the lease API and Envoy's RLS, not RLQS")

// Resolve maps a quota bucket to its ration rule and key, as Envoy's RLS
// adapter maps a descriptor (envoydesc.Append): the domain under
// domainKey, then the bucket id's pairs sorted by key. The rule is the
// first enforced (not shadow) rule of pol, in file order, that applies.
func Resolve(pol *policy.Set, domainKey, domain string, bucket map[string]string) (*policy.Rule, string, error) {
	keys := sortedKeys(bucket)
	entries := make([]*ratelimitv3.RateLimitDescriptor_Entry, len(keys))
	for i, k := range keys {
		entries[i] = &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: bucket[k]}
	}
	ds, err := envoydesc.Append(nil, domainKey, domain, entries)
	if err != nil {
		return nil, "", fmt.Errorf("rlqs: bucket id: %w", err)
	}
	for _, r := range pol.Match(nil, ds) {
		if r.Shadow {
			continue
		}
		if r.FixedWindow() {
			return r, "", errFixed
		}
		return r, string(r.AppendKey(nil, ds)), nil
	}
	return nil, "", ErrNoRule
}
