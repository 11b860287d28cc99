package envoyrls

import (
	"errors"
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

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("the zero Config got %v, want nil", err)
	}
	for _, c := range []Config{{MaxDescriptors: -1}, {MaxEntries: -1}, {MaxHits: -1}} {
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v got %v, want ErrInvalidConfig", c, err)
		}
	}
}
