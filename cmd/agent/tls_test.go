package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ration-dev/ration/internal/regiond"
	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/internal/tlsfiles/tlstest"
)

// TestAgentBinaryOverTLS: cmd/agent dials a regiond that requires client
// certificates, with -regiond-ca, -tls-cert, -tls-key and
// -regiond-server-name, and serves Envoy over mTLS with -listen-tls-cert,
// -listen-tls-key and -listen-client-ca: a client with a certificate gets
// the policy's answers, one in plain text gets nothing.
func TestAgentBinaryOverTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "ration test CA")
	caPath := tlstest.Write(t, dir, "ca.pem", ca.PEM)
	issue := func(name string, l tlstest.Leaf) (string, string) {
		c, k := ca.Issue(t, l)
		return tlstest.Write(t, dir, name+".pem", c), tlstest.Write(t, dir, name+"-key.pem", k)
	}
	loop := []net.IP{net.IPv4(127, 0, 0, 1)}
	rc, rk := issue("regiond", tlstest.Leaf{Name: "regiond", DNS: []string{"regiond.test"}, IPs: loop, Server: true})
	ac, ak := issue("agent", tlstest.Leaf{Name: "agent", URIs: []string{"spiffe://ration.test/agent"}, IPs: loop, Client: true, Server: true})
	ec, ek := issue("envoy", tlstest.Leaf{Name: "envoy", Client: true})
	pfile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pfile, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := regiond.New(regiond.Config{Listen: "127.0.0.1:0", Admin: "-", PolicyFile: pfile, TLSCert: rc, TLSKey: rk, TLSClientCA: caPath,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd, addr := startAgentBinary(t, ctx, dir, "-regiond", d.LeaseAddr(), "-listen", "127.0.0.1:0", "-admin", "-", "-log-level", "error",
		"-round-trip-timeout", "2s",
		"-regiond-ca", caPath, "-tls-cert", ac, "-tls-key", ak, "-regiond-server-name", "regiond.test",
		"-listen-tls-cert", ac, "-listen-tls-key", ak, "-listen-client-ca", caPath)
	defer func() { cmd.Process.Kill(); cmd.Wait() }()

	tc, err := tlsfiles.Client(tlsfiles.Files{Cert: ec, Key: ek, CA: caPath})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(tc.Credentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	call := func(c *grpc.ClientConn) (*rlsv3.RateLimitResponse, error) {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		defer ccancel()
		return rlsv3.NewRateLimitServiceClient(c).ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "acme"}}}}})
	}
	// Ready once the policy streamed in from regiond over mTLS (bounded).
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := call(conn)
		if err == nil && resp.GetStatuses()[0].GetCurrentLimit() != nil {
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("first call over mTLS: %v", resp)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent never applied the policy over mTLS: %v %v", resp, err)
		}
		<-time.After(10 * time.Millisecond) // polling interval
	}
	plain, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if resp, err := call(plain); err == nil {
		t.Fatalf("a plaintext Envoy call was answered: %v", resp)
	}
}
