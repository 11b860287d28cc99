package envoyrls

import (
	"errors"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/policy"
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

// TestFixedWindowStatus describes fixed windows in Envoy's units: a
// calendar window in its own (DAY, WEEK, MONTH), whatever the current
// window's real length; a window of fixed length like a token bucket's
// period, from its nominal length (an hourly window the clock shortened is
// still an HOUR); the time until reset is the time to the window's end.
func TestFixedWindowStatus(t *testing.T) {
	type rl = rlsv3.RateLimitResponse_RateLimit
	for _, tt := range []struct {
		w      agent.Window
		period time.Duration // the current window's length
		want   *rl
	}{
		{agent.Window{Calendar: policy.CalendarDay, Length: 24 * time.Hour}, 25 * time.Hour, &rl{Name: "r", RequestsPerUnit: 1000, Unit: rlsv3.RateLimitResponse_RateLimit_DAY}},
		{agent.Window{Calendar: policy.CalendarWeek, Length: policy.NominalWeek}, 167 * time.Hour, &rl{Name: "r", RequestsPerUnit: 1000, Unit: rlsv3.RateLimitResponse_RateLimit_WEEK}},
		{agent.Window{Calendar: policy.CalendarMonth, Length: policy.NominalMonth}, 28 * 24 * time.Hour, &rl{Name: "r", RequestsPerUnit: 1000, Unit: rlsv3.RateLimitResponse_RateLimit_MONTH}},
		{agent.Window{Length: time.Minute}, time.Minute, &rl{Name: "r", RequestsPerUnit: 1000, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}},
		{agent.Window{Length: 2 * time.Hour}, time.Hour, &rl{Name: "r", RequestsPerUnit: 1000, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR, UnitMultiplier: wrapperspb.UInt32(2)}},
		{agent.Window{Length: 15 * time.Minute}, 15 * time.Minute, &rl{Name: "r", RequestsPerUnit: 1000, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, UnitMultiplier: wrapperspb.UInt32(15)}},
	} {
		d := agent.Decision{Limit: 1000, Period: tt.period, Window: tt.w, Reset: 90 * time.Minute, RetryAfter: 90 * time.Minute, Rule: "r", Path: agent.PathLease}
		st := descriptorStatus(d)
		if diff := cmp.Diff(tt.want, st.GetCurrentLimit(), protocmp.Transform()); diff != "" {
			t.Errorf("%v (-want +got):\n%s", tt.w, diff)
		}
		if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetDurationUntilReset().AsDuration() != 90*time.Minute {
			t.Errorf("%v: code %v, reset in %v; want OVER_LIMIT, 1h30m", tt.w, st.GetCode(), st.GetDurationUntilReset().AsDuration())
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
