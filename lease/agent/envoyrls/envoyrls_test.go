package envoyrls

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestCurrentLimitUnits(t *testing.T) {
	type rl = rlsv3.RateLimitResponse_RateLimit
	cases := []struct {
		limit  int64
		period time.Duration
		want   *rl
	}{
		{100, time.Second, &rl{Name: "r", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}},
		{100, time.Minute, &rl{Name: "r", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}},
		{100, 10 * time.Second, &rl{Name: "r", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND, UnitMultiplier: wrapperspb.UInt32(10)}},
		{100, 90 * time.Minute, &rl{Name: "r", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, UnitMultiplier: wrapperspb.UInt32(90)}},
		{100, 24 * time.Hour, &rl{Name: "r", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_DAY}},
		{100, 2 * time.Hour, &rl{Name: "r", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR, UnitMultiplier: wrapperspb.UInt32(2)}},
		// Less than a whole second: the same rate per second.
		{10, 100 * time.Millisecond, &rl{Name: "r", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}},
		{1, 1500 * time.Millisecond, &rl{Name: "r", RequestsPerUnit: 40, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}},
	}
	for _, tc := range cases {
		got := currentLimit("r", tc.limit, tc.period)
		if d := cmp.Diff(tc.want, got, protocmp.Transform()); d != "" {
			t.Errorf("%d per %v (-want +got):\n%s", tc.limit, tc.period, d)
		}
	}
}
