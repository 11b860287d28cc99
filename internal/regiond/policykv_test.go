package regiond

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy/kvstore"
)

// storeClient opens the policy store of d's embedded NATS, as the CLI does.
func storeClient(t *testing.T, url string) (*kvstore.Store, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := kvstore.Open(ctx, kvstore.Config{Conn: nc, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return st, nc
}

// TestPolicyFromTheStore runs regiond on the embedded NATS with the policy
// store: it waits, not ready, while the bucket is empty; applies a push
// (ration_policy_revision, GET /policy); refuses a bad revision put
// straight into the bucket, keeping the policy it had and counting it;
// follows a rollback; and decides a staged revision's changed rule beside
// the enforced one without enforcing it.
func TestPolicyFromTheStore(t *testing.T) {
	d := startDaemon(t, Config{NATSEmbedded: true, NATSListen: "127.0.0.1:0", PolicyFile: "nats-kv://ration-policy"})
	if err := d.Ready(context.Background()); err == nil {
		t.Fatal("ready with an empty policy store")
	}
	st, nc := storeClient(t, d.NATSURL())
	ctx := context.Background()

	r1, err := st.Push(ctx, []byte(perTenant(1000)), kvstore.Meta{Author: "test", Message: "first"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return d.PolicyRevision() == r1.Revision })
	if got := d.Service().Policy().Rule("per-tenant").Limit; got != 1000 {
		t.Fatalf("limit %d after the first push, want 1000", got)
	}
	if err := d.Ready(ctx); err != nil {
		t.Fatalf("not ready with a policy: %v", err)
	}
	if got := metricSum(t, d, "ration_policy_revision"); got != float64(r1.Revision) {
		t.Errorf("ration_policy_revision = %v, want %d", got, r1.Revision)
	}

	r2, err := st.Push(ctx, []byte(perTenant(2000)), kvstore.Meta{Author: "test", Message: "raise"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return d.PolicyRevision() == r2.Revision })

	// A bad revision written past the CLI, with the nats tools.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, kvstore.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := kv.Put(ctx, kvstore.KeyEnforced, []byte("rules:\n  - {name: per-tenant, key: [tenant], limit: -5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return metricSum(t, d, "ration_policy_refused_total") >= 1 })
	if got := d.PolicyRevision(); got != r2.Revision {
		t.Fatalf("after bad revision %d: applied %d, want %d kept", bad, got, r2.Revision)
	}
	if got := d.Service().Policy().Rule("per-tenant").Limit; got != 2000 {
		t.Fatalf("after a bad revision: limit %d, want 2000 kept", got)
	}

	r4, err := st.Rollback(ctx, r1.Revision, kvstore.Meta{Author: "test", Message: "back"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return d.PolicyRevision() == r4.Revision })
	if got := d.Service().Policy().Rule("per-tenant").Limit; got != 1000 {
		t.Fatalf("after the rollback: limit %d, want 1000", got)
	}

	// Staged: the changed rule is decided beside the enforced one.
	if _, err := st.Push(ctx, []byte(perTenant(10)), kvstore.Meta{Author: "test", Message: "try", Shadow: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return d.Service().Policy().Rule("per-tenant.staged") != nil })
	pol := d.Service().Policy()
	if r := pol.Rule("per-tenant.staged"); !r.IsStaged() || r.Limit != 10 || pol.Rule("per-tenant").Limit != 1000 {
		t.Fatalf("staged: per-tenant %d, per-tenant.staged %+v; want 1000 enforced and a shadow of 10", pol.Rule("per-tenant").Limit, r)
	}
	// An agent reporting demand the staged rule would deny: counted.
	if _, err := client(t, d).Lease(ctx, &leasev1.LeaseRequest{
		Agent: &leasev1.Agent{Id: "test-agent"},
		Items: []*leasev1.LeaseItem{{Rule: "per-tenant.staged", Key: "tenant=acme", Want: 5, Demand: 50, Admitted: 10}},
	}); err != nil {
		t.Fatal(err)
	}
	if got := metricSum(t, d, "ration_policy_staged_denied_tokens_total", "rule", "per-tenant.staged"); got != 40 {
		t.Errorf("ration_policy_staged_denied_tokens_total = %v, want 40", got)
	}
}
