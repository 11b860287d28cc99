package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/regiond"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
)

// refusedReasons are the exchange's drop reasons for a message that is
// not a report from a region of the deployment (ration_exchange_dropped_total).
var refusedReasons = []string{"corrupt", "truncated", "oversized", "version", "inconsistent", "malformed", "unknown_region"}

// TestFaultMalformedInput: a client floods the exchange's subjects with
// messages that are not reports of the deployment — garbage, a 900 KB
// message, truncated and re-versioned reports, reports from a region the
// deployment does not have or with an over-long region name, some on a
// real region's subject — and the lease API with requests that break its
// rules (no agent, oversized agent id, batch or key, unknown rule, bad
// counts), some for a canary key no valid request ever names. Nothing
// crashes, every message and request is refused and counted (each
// daemon's ration_exchange_dropped_total grows by exactly the messages;
// eu's ration_lease_requests_total{outcome="invalid"} by exactly the
// requests), the canary has no bucket and no share in any region's
// Redis, and the global key's shares stay at their targets.
func TestFaultMalformedInput(t *testing.T) {
	needFaults(t)
	seed := time.Now().UnixNano()
	t.Logf("seed %d (the garbage's bytes)", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	w := newWorld(t, nil, nil)
	w.startRegions()
	w.steady()

	msgs := exchangeGarbage(t, rng)
	reqs := leaseGarbage()
	dropped := map[string]float64{}
	for _, r := range regions {
		dropped[r] = metricSum(t, w.daemons[r][0], "ration_exchange_dropped_total", "reason", refusedReasons...)
	}
	eu := w.daemons["eu"][0]
	invalid := metricSum(t, eu, "ration_lease_requests_total", "outcome", "invalid")

	began := time.Now()
	nc, err := nats.Connect(w.nats["eu"])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for i, m := range msgs {
		subject := "ration.sync.zz"
		if i%2 == 0 {
			subject = "ration.sync." + regions[i%len(regions)] // a real region's subject
		}
		if err := nc.Publish(subject, m); err != nil {
			t.Fatalf("publish message %d: %v", i, err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(eu.LeaseAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := leasev1.NewLeaseServiceClient(conn)
	for _, rq := range reqs {
		err := rq.call(context.Background(), c)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", rq.name, err)
		}
	}
	ended := time.Now()

	for _, r := range regions {
		waitUntil(t, 10*time.Second, r+" counts every exchange message refused", func() bool {
			return metricSum(t, w.daemons[r][0], "ration_exchange_dropped_total", "reason", refusedReasons...)-dropped[r] >= float64(len(msgs))
		})
	}
	w.row("malformed-input", began, ended)
	for _, r := range regions {
		if got := metricSum(t, w.daemons[r][0], "ration_exchange_dropped_total", "reason", refusedReasons...) - dropped[r]; got != float64(len(msgs)) {
			t.Errorf("%s refused %v exchange messages, want the %d sent", r, got, len(msgs))
		}
		if code, _ := httpGet(w.daemons[r][0].AdminAddr() + "/healthz"); code != 200 {
			t.Errorf("%s's /healthz: %d after the flood", r, code)
		}
	}
	if got := metricSum(t, eu, "ration_lease_requests_total", "outcome", "invalid") - invalid; got != float64(len(reqs)) {
		t.Errorf("eu counted %v invalid lease API calls, want the %d sent", got, len(reqs))
	}
	for _, r := range regions {
		rc := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(w.redis[r], "redis://")})
		keys, err := rc.Keys(context.Background(), "*canary*").Result()
		_ = rc.Close()
		if err != nil {
			t.Fatalf("%s's Redis: %v", r, err)
		}
		if len(keys) != 0 {
			t.Errorf("%s's Redis holds %v: a refused request changed a bucket or share", r, keys)
		}
	}
	t.Logf("refused %d exchange messages in each of %d regions and %d lease API calls", len(msgs), len(regions), len(reqs))
}

// exchangeGarbage is what the flood publishes on the exchange's subjects.
func exchangeGarbage(t *testing.T, rng *rand.Rand) [][]byte {
	t.Helper()
	var msgs [][]byte
	for range 200 { // random bytes of random lengths
		b := make([]byte, 1+rng.IntN(4096))
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		msgs = append(msgs, b)
	}
	big := make([]byte, 900<<10) // below NATS's 1 MiB max_payload, which refuses more at the publisher
	for i := range big {
		big[i] = byte(rng.UintN(256))
	}
	msgs = append(msgs, big)
	epoch := uint64(time.Now().UnixNano() / int64(syncPeriod))
	// Each report from its own replica, so that none is refused as a
	// duplicate of another (which would be counted too, as duplicate).
	n := 0
	report := func(from string, keyBytes int) []byte {
		n++
		r := region.Report{
			Region: from, Replica: fmt.Sprintf("forged-%d", n), Epoch: epoch, SentAt: time.Now(),
			Regions: append(append([]string(nil), regions...), from),
			Keys:    []region.KeyReport{{Key: key + strings.Repeat("x", keyBytes), Demand: 1 << 40}},
		}
		parts, err := codec.EncodeReport(&r, rng.Uint64(), 1<<20)
		if err != nil || len(parts) != 1 {
			t.Fatalf("encode a forged report from %q: %d parts, %v", from, len(parts), err)
		}
		return parts[0]
	}
	for range 20 {
		msgs = append(msgs,
			report("zz", 0),                     // a region the deployment does not have
			report(strings.Repeat("r", 300), 0), // a region name longer than any allowed
			report("zz", 8192),                  // a key identity longer than allowed
		)
		whole := report("zz", 0)
		msgs = append(msgs, whole[:len(whole)/2]) // truncated
		v := append([]byte(nil), whole...)
		v[1] = 9 // an envelope version this build does not read
		msgs = append(msgs, v)
	}
	return msgs
}

// leaseCall is one malformed lease API call.
type leaseCall struct {
	name string
	call func(context.Context, leasev1.LeaseServiceClient) error
}

// leaseGarbage is what the flood sends to the lease API; every call is
// invalid as a whole, and many name the canary key.
func leaseGarbage() []leaseCall {
	agent := &leasev1.Agent{Id: "flood"}
	item := func(rule, key string, want, demand, admitted int64) *leasev1.LeaseItem {
		return &leasev1.LeaseItem{Rule: rule, Key: key, Want: want, Demand: demand, Admitted: admitted}
	}
	canary := "tenant=canary"
	lease := func(name string, a *leasev1.Agent, items ...*leasev1.LeaseItem) leaseCall {
		return leaseCall{name, func(ctx context.Context, c leasev1.LeaseServiceClient) error {
			_, err := c.Lease(ctx, &leasev1.LeaseRequest{Agent: a, Items: items})
			return err
		}}
	}
	ret := func(name string, items ...*leasev1.ReturnItem) leaseCall {
		return leaseCall{name, func(ctx context.Context, c leasev1.LeaseServiceClient) error {
			_, err := c.Return(ctx, &leasev1.ReturnRequest{Agent: agent, Items: items})
			return err
		}}
	}
	many := make([]*leasev1.LeaseItem, 1001)
	for i := range many {
		many[i] = item("per-tenant", canary, 1, 1, 0)
	}
	return []leaseCall{
		lease("no agent", nil, item("per-tenant", canary, 1, 1, 0)),
		lease("an agent id of 300 bytes", &leasev1.Agent{Id: strings.Repeat("a", 300)}, item("per-tenant", canary, 1, 1, 0)),
		lease("no items", agent),
		lease("1,001 items", agent, many...),
		lease("an unknown rule", agent, item("nope", canary, 1, 1, 0)),
		lease("an empty key", agent, item("per-tenant", "", 1, 1, 0)),
		lease("a key of 2,000 bytes", agent, item("per-tenant", "tenant="+strings.Repeat("c", 2000), 1, 1, 0)),
		lease("want 0", agent, item("per-tenant", canary, 0, 1, 0)),
		lease("want below zero", agent, item("per-tenant", canary, -1<<40, 1, 0)),
		lease("demand below zero", agent, item("per-tenant", canary, 1, -1, 0)),
		lease("admitted above demand", agent, item("per-tenant", canary, 1, 1, 5)),
		lease("a valid item beside an invalid one", agent, item("per-tenant", canary, 10, 10, 0), item("per-tenant", canary, -1, 1, 0)),
		ret("a return of no tokens", &leasev1.ReturnItem{Rule: "per-tenant", Key: canary, Tokens: 0}),
		ret("a return below zero", &leasev1.ReturnItem{Rule: "per-tenant", Key: canary, Tokens: -1 << 40}),
		ret("a return to an unknown rule", &leasev1.ReturnItem{Rule: "nope", Key: canary, Tokens: 5}),
	}
}

var metricLine = regexp.MustCompile(`(?m)^([a-z_]+)\{([^}]*)\} ([0-9.e+]+)$`)

// metricSum sums d's /metrics samples of name whose label has one of
// values.
func metricSum(t *testing.T, d *regiond.Daemon, name, label string, values ...string) float64 {
	t.Helper()
	code, body := httpGet(d.AdminAddr() + "/metrics")
	if code != 200 {
		t.Fatalf("%s/metrics: %d", d.AdminAddr(), code)
	}
	var sum float64
	for _, m := range metricLine.FindAllStringSubmatch(body, -1) {
		if m[1] != name {
			continue
		}
		for _, v := range values {
			if strings.Contains(","+m[2]+",", ","+label+`="`+v+`",`) {
				f, err := strconv.ParseFloat(m[3], 64)
				if err != nil {
					t.Fatalf("%s: %v", m[0], err)
				}
				sum += f
			}
		}
	}
	return sum
}
