package regiond

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/internal/tlsfiles/tlstest"
)

// rlqsFirstAction opens an RLQS stream to addr with creds, subscribes
// tenant acme of domain edge and returns the first action, or the error.
func rlqsFirstAction(addr string, creds grpc.DialOption) (*rlqsv3.RateLimitQuotaResponse_BucketAction, error) {
	conn, err := grpc.NewClient(addr, creds)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}}, NumRequestsAllowed: 10}}}); err != nil {
		return nil, err
	}
	resp, err := st.Recv()
	if err != nil {
		return nil, err
	}
	if len(resp.GetBucketAction()) == 0 {
		return nil, errors.New("an empty response")
	}
	return resp.GetBucketAction()[0], nil
}

// TestRLQSMutualTLS: -rlqs-listen serves with the lease API's TLS: a proxy
// with a client certificate of its CA gets a token bucket; one without a
// certificate, or in plain text, gets nothing. At shutdown the daemon ends
// the RLQS server with the rest.
func TestRLQSMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "ration test CA")
	caPath := tlstest.Write(t, dir, "ca.pem", ca.PEM)
	sc, sk := ca.Issue(t, tlstest.Leaf{Name: "regiond", DNS: []string{"regiond.eu.test"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	cc, ck := ca.Issue(t, tlstest.Leaf{Name: "envoy", URIs: []string{"spiffe://ration.test/envoy"}, Client: true})
	d := startDaemon(t, Config{
		PolicyYAML: []byte(rlqsPolicy),
		RLQSListen: "127.0.0.1:0",
		TLSCert:    tlstest.Write(t, dir, "server.pem", sc), TLSKey: tlstest.Write(t, dir, "server-key.pem", sk), TLSClientCA: caPath,
	})
	good, err := tlsfiles.Client(tlsfiles.Files{Cert: tlstest.Write(t, dir, "client.pem", cc), Key: tlstest.Write(t, dir, "client-key.pem", ck),
		CA: caPath, ServerName: "regiond.eu.test"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := rlqsFirstAction(d.RLQSAddr(), grpc.WithTransportCredentials(good.Credentials()))
	if err != nil || a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
		t.Fatalf("with a client certificate: %v, %v; want a token bucket", a, err)
	}
	noCert, err := tlsfiles.Client(tlsfiles.Files{CA: caPath, ServerName: "regiond.eu.test"})
	if err != nil {
		t.Fatal(err)
	}
	if a, err := rlqsFirstAction(d.RLQSAddr(), grpc.WithTransportCredentials(noCert.Credentials())); err == nil {
		t.Errorf("without a client certificate: got %v", a)
	}
	if a, err := rlqsFirstAction(d.RLQSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials())); err == nil {
		t.Errorf("in plain text: got %v", a)
	}
}

func TestRLQSPlaintextRefusedBeyondLoopback(t *testing.T) {
	for _, tc := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{RLQSListen: "127.0.0.1:7072"}, true},
		{Config{RLQSListen: ":7072"}, false},
		{Config{RLQSListen: ":7072", Insecure: true}, true},
		{Config{RLQSListen: ":7072", TLSCert: "c.pem", TLSKey: "k.pem"}, true},
	} {
		err := tc.cfg.Validate()
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: got %v, want ok %v", tc.cfg, err, tc.ok)
		}
	}
}
