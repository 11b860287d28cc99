package rlqs

import (
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// encode is the wire form of one bucket's action.
func (c *Core) encode(q *quota, a action) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	ba := &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: &rlqsv3.BucketId{Bucket: q.bucket}}
	if a.kind == actAbandon {
		c.met.actions.WithLabelValues("abandon").Inc()
		ba.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}
		return ba
	}
	var rs *typev3.RateLimitStrategy
	switch a.kind {
	case actBucket:
		rs = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens:     uint32(min(a.strategy.max, 1<<32-1)),
			TokensPerFill: wrapperspb.UInt32(uint32(min(a.strategy.perFill, 1<<32-1))),
			FillInterval:  durationpb.New(c.z.fill),
		}}}
		if a.ttl > 0 {
			c.met.actions.WithLabelValues("token_bucket").Inc()
		}
	case actDeny, actAllow:
		rule, label := typev3.RateLimitStrategy_DENY_ALL, "deny_all"
		if a.kind == actAllow {
			rule, label = typev3.RateLimitStrategy_ALLOW_ALL, "allow_all"
		}
		rs = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}
		if a.ttl > 0 {
			c.met.actions.WithLabelValues(label).Inc()
		}
	}
	ba.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(a.ttl),
			RateLimitStrategy:    rs,
		}}
	return ba
}
