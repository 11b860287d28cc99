package grpclimit

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/lease/agent/internal/leaseserver"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testPolicy = `
rules:
  - name: per-key
    key: [api_key]
    limit: 2
    period: 1m
  - name: guarded
    match: { route: /grpc.health.v1.Health/List }
    key: [ip]
    limit: 1000
    period: 1s
    on_error: closed
`

// serve runs the gRPC health service behind the interceptors, deciding with
// a real agent against r, and returns a client.
func serve(t *testing.T, r *leaseserver.Server) healthpb.HealthClient {
	t.Helper()
	a, err := agent.New(agent.Config{
		Target: r.Addr, Logger: leaseserver.Quiet(),
		RoundTripTimeout: time.Second, ProbeInterval: 20 * time.Millisecond, BreakerFailures: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.WaitPolicy(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Agent: a, Metadata: map[string]string{"x-api-key": "api_key"}}
	unary, err := UnaryServerInterceptor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := StreamServerInterceptor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	done := make(chan struct{})
	go func() { defer close(done); g.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		hs.Shutdown()
		g.Stop()
		<-done
	})
	return healthpb.NewHealthClient(conn)
}

func withKey(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
}

func TestUnaryResourceExhaustedWithRetryInfo(t *testing.T) {
	r := leaseserver.Start(t, testPolicy, service.Config{LeaseTTL: time.Minute})
	c := serve(t, r)
	for i := 0; i < 2; i++ {
		if _, err := c.Check(withKey("k1"), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	_, err := c.Check(withKey("k1"), &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("3rd call got %v, want ResourceExhausted", err)
	}
	var retry *errdetails.RetryInfo
	var quota *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.QuotaFailure:
			quota = d
		}
	}
	if retry == nil || retry.GetRetryDelay().AsDuration() <= 0 || retry.GetRetryDelay().AsDuration() > 30*time.Second {
		t.Errorf("RetryInfo got %v, want a delay in (0, 30s] (a token every 30s)", retry)
	}
	if quota == nil || len(quota.Violations) != 1 || quota.Violations[0].Subject != "per-key" {
		t.Errorf("QuotaFailure got %v, want one violation of per-key", quota)
	}
	if want := `rate limit "per-key" exceeded: 2 per 1m0s`; st.Message() != want {
		t.Errorf("message got %q, want %q", st.Message(), want)
	}
	// Another key, and a call matching no rule, go through.
	if _, err := c.Check(withKey("k2"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("other key: %v", err)
	}
	if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("no key: %v", err)
	}
}

func TestStreamDecidedWhenItOpens(t *testing.T) {
	r := leaseserver.Start(t, testPolicy, service.Config{LeaseTTL: time.Minute})
	c := serve(t, r)
	ctx, cancel := context.WithCancel(withKey("s1"))
	defer cancel()
	for i := 0; i < 2; i++ {
		w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("3rd stream got %v, want ResourceExhausted", err)
	}
}

func TestFailClosedIsUnavailable(t *testing.T) {
	r := leaseserver.Start(t, testPolicy, service.Config{})
	c := serve(t, r)
	r.Crash()
	_, err := c.List(context.Background(), &healthpb.HealthListRequest{})
	st := status.Convert(err)
	if st.Code() != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	found := false
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			found = true
		}
	}
	if !found {
		t.Errorf("no RetryInfo in %v", st.Details())
	}
}

func TestDescriptors(t *testing.T) {
	cfg := Config{
		Metadata: map[string]string{"x-api-key": "api_key"},
		Extra: func(ctx context.Context, m string, dst []policy.Descriptor) []policy.Descriptor {
			return append(dst, policy.Descriptor{Key: "tenant", Value: "acme"})
		},
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "secret"))
	got := cfg.Descriptors(ctx, "/pkg.Things/Get", nil)
	want := []policy.Descriptor{
		{Key: "route", Value: "/pkg.Things/Get"}, {Key: "service", Value: "pkg.Things"},
		{Key: "api_key", Value: "secret"}, {Key: "tenant", Value: "acme"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("descriptors (-want +got):\n%s", diff)
	}
	if _, err := UnaryServerInterceptor(Config{}); err != ErrNoAgent {
		t.Errorf("got %v, want ErrNoAgent", err)
	}
}

// TestDenialErrorFixedWindow names the window in the message and the
// QuotaFailure, and gives the time to the window's end as the RetryInfo.
func TestDenialErrorFixedWindow(t *testing.T) {
	for _, tt := range []struct {
		d    agent.Decision
		want string
	}{
		{agent.Decision{Limit: 1000, Period: 25 * time.Hour, Window: agent.Window{Calendar: policy.CalendarDay, Length: 24 * time.Hour}, RetryAfter: 5 * time.Hour, Rule: "daily", Path: agent.PathLease},
			`rate limit "daily" exceeded: 1000 per day`},
		{agent.Decision{Limit: 100, Period: time.Minute, Window: agent.Window{Length: time.Minute}, RetryAfter: 12 * time.Second, Rule: "per-minute", Path: agent.PathDenyCache},
			`rate limit "per-minute" exceeded: 100 per 1m0s window`},
		{agent.Decision{Limit: 7, Period: 167 * time.Hour, Window: agent.Window{Calendar: policy.CalendarWeek, Length: policy.NominalWeek}, RetryAfter: 3 * time.Hour, Rule: "weekly", Path: agent.PathLease},
			`rate limit "weekly" exceeded: 7 per week`},
	} {
		st := status.Convert(DenialError(tt.d))
		if st.Code() != codes.ResourceExhausted || st.Message() != tt.want {
			t.Errorf("got %v %q, want ResourceExhausted %q", st.Code(), st.Message(), tt.want)
		}
		for _, det := range st.Details() {
			switch det := det.(type) {
			case *errdetails.RetryInfo:
				if got := det.GetRetryDelay().AsDuration(); got != tt.d.RetryAfter {
					t.Errorf("%s: RetryInfo %v, want %v", tt.d.Rule, got, tt.d.RetryAfter)
				}
			case *errdetails.QuotaFailure:
				if got := det.GetViolations()[0].GetDescription(); got != tt.want {
					t.Errorf("%s: QuotaFailure says %q, want %q", tt.d.Rule, got, tt.want)
				}
			}
		}
	}
}
