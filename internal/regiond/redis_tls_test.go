package regiond

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/internal/tlsfiles/tlstest"
	"github.com/ration-dev/ration/lease"
)

// redisACL is the Redis ACL user the README documents: ration's keys only,
// no pub/sub, and only the command categories it runs (scripts, reads and
// writes of its keys, INFO for the server's run_id, TIME), never a
// dangerous one (FLUSHALL, KEYS, CONFIG, DEBUG...).
const redisACL = "on >a-redis-password-for-ration ~ration:* resetchannels -@all +@read +@write +@scripting +@connection -@dangerous +info +time"

// TestRedisOverTLSWithACLUser: regiond on a real redis-server that serves
// TLS only and requires client certificates, as an ACL user limited to
// redisACL, with the exchange on (the holder election and its persisted
// state in the same Redis): leases are granted, the region is ready, and
// the exchange saves its state.
func TestRedisOverTLSWithACLUser(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "redis CA")
	caPath := tlstest.Write(t, dir, "ca.pem", ca.PEM)
	sc, sk := ca.Issue(t, tlstest.Leaf{Name: "redis", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	cc, ck := ca.Issue(t, tlstest.Leaf{Name: "regiond", Client: true})
	cf := tlsfiles.Files{CA: caPath, Cert: tlstest.Write(t, dir, "client.pem", cc), Key: tlstest.Write(t, dir, "client-key.pem", ck)}
	ping, err := tlsfiles.Client(cf)
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.StartTLSServer(t, redistest.TLS{
		Cert: tlstest.Write(t, dir, "redis.pem", sc), Key: tlstest.Write(t, dir, "redis-key.pem", sk), CA: caPath, Client: ping.For("127.0.0.1"),
	}, append([]string{"--user", "ration"}, strings.Fields(redisACL)...)...)
	url := "rediss://ration:a-redis-password-for-ration@" + srv.Addr() + "/0"
	d := startDaemon(t, Config{
		PolicyYAML: []byte(tlsPolicy), RedisURL: url, RedisCA: cf.CA, RedisCert: cf.Cert, RedisKey: cf.Key,
		NATSEmbedded: true, NATSListen: "127.0.0.1:0",
		// The exchange's store calls get half a period: room for a new TLS
		// connection under the race detector.
		SyncPeriod: 500 * time.Millisecond,
		// A new TLS connection, its AUTH and the scripts' load take longer
		// than the production 50ms under the race detector.
		StoreTimeout: time.Second,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := leaseOne(ctx, client(t, d), "per-tenant", "tenant=acme", 10)
	if err != nil || resp.Grants[0].GetGranted() != 10 {
		t.Fatalf("a lease on a Redis over TLS as an ACL user: %v, %v", resp, err)
	}
	if err := d.Ready(ctx); err != nil {
		t.Fatalf("not ready: %v", err)
	}
	// The exchange holds the election and saves its state in Redis
	// (bounded wait on the condition).
	deadline := time.Now().Add(10 * time.Second)
	for d.x == nil || !d.x.Leader() || metricSum(t, d, "ration_exchange_state_written_bytes_total") == 0 || metricSum(t, d, "ration_exchange_epochs_total") < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the exchange never held the region's election and saved its state on the TLS Redis")
		}
		<-time.After(20 * time.Millisecond)
	}
	if n := metricSum(t, d, "ration_exchange_store_errors_total"); n != 0 {
		t.Errorf("%v exchange store errors as the ACL user", n)
	}
	// The user can do no more than that.
	rc, err := lease.NewRedisClientTLS(url, ping.Dial)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	for _, cmd := range [][]any{{"FLUSHALL"}, {"KEYS", "*"}, {"CONFIG", "GET", "*"}, {"SET", "other:key", "1"}} {
		if err := rc.Do(ctx, cmd...).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%v as the ACL user: got %v, want NOPERM", cmd, err)
		}
	}
}

// metricSum is the sum of a counter's series in d's registry, of those
// with the label values in pairs (name, value, ...) when given.
func metricSum(t *testing.T, d *Daemon, name string, pairs ...string) float64 {
	t.Helper()
	mfs, err := d.cfg.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(pairs); i += 2 {
				if labels[pairs[i]] != pairs[i+1] {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}
