package service

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	leasev1 "github.com/ration-dev/ration/lease/v1"
)

// TestForgedRequestsSetNoLimit: an agent never sets a limit. A request that
// carries a limit, a rate or an agent count the API has no field for (as
// unknown protobuf fields), or asks for more than the bucket holds, is
// granted what the policy's bucket holds and told the policy's limit; a
// flood of agent identities counts at most MaxAgents agents (the count only
// sizes each agent's emergency bucket, smaller for more agents).
func TestForgedRequestsSetNoLimit(t *testing.T) {
	f := start(t, Config{MaxAgents: 50})
	forge := func(m proto.Message, field protowire.Number, v uint64) {
		b := protowire.AppendTag(nil, field, protowire.VarintType)
		m.ProtoReflect().SetUnknown(protowire.AppendVarint(b, v))
	}
	item := &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=forger", Want: 1_000_000, Demand: 1}
	forge(item, 90, 1_000_000_000) // "limit"
	req := &leasev1.LeaseRequest{Agent: agent("forger"), Items: []*leasev1.LeaseItem{item}}
	forge(req, 91, 1) // "agents"
	resp, err := f.svc.Lease(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if g := resp.Grants[0]; g.GetGranted() != 200 || g.GetLimit() != 100 || g.GetCapacity() != 200 || g.GetRate() != 100 {
		t.Fatalf("a forged request got %d tokens, limit %d, capacity %v, rate %v; want the policy's bucket: 200, 100, 200, 100", g.GetGranted(), g.GetLimit(), g.GetCapacity(), g.GetRate())
	}
	for i := range 500 {
		if _, err := f.svc.Lease(context.Background(), &leasev1.LeaseRequest{Agent: agent(fmt.Sprint("sybil-", i)), Items: []*leasev1.LeaseItem{{Rule: "per-tenant", Key: "tenant=x", Want: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.svc.Agents(); n > 50 {
		t.Fatalf("500 forged agent identities counted %d agents, want at most MaxAgents (50)", n)
	}
}
