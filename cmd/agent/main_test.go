package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/ration-dev/ration/internal/regiond"
)

const policy = `
rules:
  - name: edge-per-key
    match: { domain: edge }
    key: [generic_key]
    limit: 5
    period: 1m
    burst: 5
  - name: strict
    match: { domain: strict }
    key: [user]
    limit: 100
    period: 1s
    on_error: closed
`

// TestEnvoyRLSAgainstBinary runs cmd/agent as a process beside an
// in-process regiond and calls it with go-control-plane's generated Envoy
// rate limit client.
func TestEnvoyRLSAgainstBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir := t.TempDir()
	pfile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pfile, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := regiond.New(regiond.Config{Listen: "127.0.0.1:0", Admin: "-", PolicyFile: pfile,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopRegion := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("regiond shutdown: %v", err)
		}
	}
	defer stopRegion()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd, addr := startAgentBinary(t, ctx, dir, "-regiond", d.LeaseAddr(), "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-log-level", "error",
		// A loaded CI machine running the race detector can take longer
		// than the production default of 5ms for a cold key's round trip.
		"-round-trip-timeout", "2s")
	defer cmd.Process.Kill()

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	call := func(domain string, hits uint32, entries ...string) (*rlsv3.RateLimitResponse, error) {
		d := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i < len(entries); i += 2 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: entries[i], Value: entries[i+1]})
		}
		return rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	}

	// The agent is ready once the policy streamed in from regiond; a call
	// before that would be allowed with no rule.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := call("edge", 1, "generic_key", "probe")
		if err == nil && resp.GetStatuses()[0].GetCurrentLimit() != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent never applied the policy: %v %v", resp, err)
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}

	// 5 per minute: two calls of 2 hits pass, the third does not.
	var codesSeen []rlsv3.RateLimitResponse_Code
	var last *rlsv3.RateLimitResponse
	for i := 0; i < 3; i++ {
		resp, err := call("edge", 2, "generic_key", "acme")
		if err != nil {
			t.Fatal(err)
		}
		codesSeen = append(codesSeen, resp.GetOverallCode())
		last = resp
	}
	wantCodes := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}
	if d := cmp.Diff(wantCodes, codesSeen); d != "" {
		t.Fatalf("overall codes (-want +got):\n%s", d)
	}
	st := last.GetStatuses()[0]
	wantLimit := &rlsv3.RateLimitResponse_RateLimit{Name: "edge-per-key", RequestsPerUnit: 5, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}
	if d := cmp.Diff(wantLimit, st.GetCurrentLimit(), protocmp.Transform()); d != "" {
		t.Errorf("current_limit (-want +got):\n%s", d)
	}
	if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() > 1 {
		t.Errorf("got status %v remaining %d, want OVER_LIMIT and at most 1 left", st.GetCode(), st.GetLimitRemaining())
	}
	if r := st.GetDurationUntilReset().AsDuration(); r <= 0 || r > time.Minute {
		t.Errorf("got duration_until_reset %v, want within (0, 1m]", r)
	}
	// The rate-limit fields for Envoy to pass to the client.
	fields := map[string]string{}
	for _, h := range last.GetResponseHeadersToAdd() {
		fields[h.GetKey()] = h.GetValue()
	}
	if got, want := fields["Ratelimit-Policy"], `"edge-per-key";q=5;w=60`; got != want || fields["Ratelimit"] == "" || fields["Retry-After"] == "" {
		t.Errorf("response_headers_to_add %v, want RateLimit-Policy %s, RateLimit and Retry-After", fields, want)
	}

	// A request no rule matches is OK with no limit.
	resp, err := call("other", 1, "generic_key", "acme")
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Fatalf("unmatched request: got %v %v, want OK with no limit", resp, err)
	}
	// Bad input is InvalidArgument.
	if _, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no descriptors: got %v, want InvalidArgument", err)
	}

	// With the region gone, a fail-closed rule answers Unavailable (Envoy's
	// status_on_error: 503), not OVER_LIMIT.
	stopRegion()
	if _, err := call("strict", 1, "user", "u1"); status.Code(err) != codes.Unavailable {
		t.Fatalf("fail-closed rule with the region down: got %v, want Unavailable", err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v, want exit status 0", err)
	}
}

// startAgentBinary builds cmd/agent into dir and runs it with args until
// ctx ends, returning the process and where its Envoy service listens (from
// its first line of output; the rest is discarded).
func startAgentBinary(t *testing.T, ctx context.Context, dir string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	bin := filepath.Join(dir, "agent")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("go build: %v", err)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		t.Fatalf("reading the first line: %v", err)
	}
	m := regexp.MustCompile(`service on (\S+),`).FindStringSubmatch(line)
	if m == nil {
		cmd.Process.Kill()
		t.Fatalf("got first line %q, want where it listens", line)
	}
	go io.Copy(io.Discard, out)
	return cmd, m[1]
}
