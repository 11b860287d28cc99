package agent_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
)

// Example runs a region in-process (the lease service over the in-memory
// allocator, on a loopback port: in production this is regiond) and an
// agent that decides requests against it.
func Example() {
	pol, err := policy.Parse("example.yaml", []byte(`
rules:
  - name: per-tenant
    key: [tenant]
    limit: 3
    period: 1m
`))
	if err != nil {
		panic(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := service.New(service.Config{
		Region: "eu", Store: lease.NewMemoryStore(lease.MemoryConfig{}), Policy: pol, Logger: quiet,
	})
	if err != nil {
		panic(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer()
	svc.Register(srv)
	go srv.Serve(lis)
	defer srv.Stop()
	defer svc.Close()

	// The gateway's side: an agent pointed at the region.
	a, err := agent.New(agent.Config{Target: lis.Addr().String(), Logger: quiet, RoundTripTimeout: time.Second})
	if err != nil {
		panic(err)
	}
	defer a.Close()
	ctx := context.Background()
	if err := a.WaitPolicy(ctx); err != nil {
		panic(err)
	}

	acme := []policy.Descriptor{{Key: "tenant", Value: "acme"}, {Key: "route", Value: "/v1/things"}}
	for i := 0; i < 4; i++ {
		d := a.Allow(ctx, acme, 1)
		fmt.Printf("allowed=%v rule=%s limit=%d/%v retry-after>0=%v\n", d.Allowed, d.Rule, d.Limit, d.Period, d.RetryAfter > 0)
	}
	// Output:
	// allowed=true rule=per-tenant limit=3/1m0s retry-after>0=false
	// allowed=true rule=per-tenant limit=3/1m0s retry-after>0=false
	// allowed=true rule=per-tenant limit=3/1m0s retry-after>0=false
	// allowed=false rule=per-tenant limit=3/1m0s retry-after>0=true
}
