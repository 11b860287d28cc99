package faults

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/region"
)

// TestFaultRegiondKilled: eu runs two regiond processes (cmd/regiond,
// built for the test) on one Redis; the one holding eu's exchange is
// killed with SIGKILL. eu's agent knows both replicas (the holder first);
// the other replica takes the exchange over from what the holder
// persisted, and the agent's calls go to it.
func TestFaultRegiondKilled(t *testing.T) {
	needFaults(t)
	bin := buildRegiond(t)
	w := newWorld(t, nil, nil)
	reps := []*regiondProc{w.startProc(t, bin, "eu-a"), w.startProc(t, bin, "eu-b")}
	store := shareReader(t, w.redis["eu"])
	w.share["eu"] = store
	for _, r := range []string{"ap", "us"} {
		w.startDaemon(r, r+"-0")
	}
	var holder, other *regiondProc
	waitUntil(t, 15*time.Second, "one eu replica holds the exchange", func() bool {
		a, b := reps[0].leader(), reps[1].leader()
		switch {
		case a && !b:
			holder, other = reps[0], reps[1]
		case b && !a:
			holder, other = reps[1], reps[0]
		default:
			return false
		}
		return true
	})
	rs := manual.NewBuilderWithScheme("faults")
	rs.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: holder.lease}, {Addr: other.lease}}})
	w.gws["eu"] = w.startGateway("eu", agent.Config{Target: "faults:///eu", DialOptions: []grpc.DialOption{grpc.WithResolvers(rs)}})
	w.startRegions()
	w.steady()

	began := time.Now()
	holder.kill()
	took := waitUntil(t, 15*time.Second, "the other replica takes the exchange over", other.leader)
	t.Logf("%s killed (SIGKILL); %s holds the exchange %v later", holder.name, other.name, took.Round(time.Millisecond))
	w.row("regiond-sigkill", began, began)
}

// buildRegiond builds cmd/regiond into the test's temporary directory.
func buildRegiond(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("building cmd/regiond needs the go command: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "regiond")
	out, err := exec.Command(gobin, "build", "-o", bin, "github.com/ration-dev/ration/cmd/regiond").CombinedOutput()
	if err != nil {
		t.Fatalf("go build cmd/regiond: %v\n%s", err, out)
	}
	return bin
}

// regiondProc is a regiond process, a replica of eu.
type regiondProc struct {
	name, lease, admin string
	cmd                *exec.Cmd
	done               chan struct{}
}

// startProc runs bin as replica name of eu and waits until its admin
// endpoint answers; it is killed at cleanup if still running.
func (w *world) startProc(t *testing.T, bin, name string) *regiondProc {
	t.Helper()
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "regiond.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = log.Close() })
	p := &regiondProc{name: name, lease: freeAddr(t), admin: freeAddr(t), done: make(chan struct{})}
	p.cmd = exec.Command(bin, "-region", "eu", "-regions", strings.Join(regions, ","), "-replica", name,
		"-listen", p.lease, "-admin", p.admin, "-redis", w.redis["eu"], "-nats", w.nats["eu"], "-policy", pol,
		"-sync-period", syncPeriod.String(), "-decide-after", (syncPeriod / 10).String(),
		"-lease-ttl", leaseTTL.String(), "-store-timeout", storeTimeout.String(), "-log-level", "warn")
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Reaps the process; finished by kill.
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.kill)
	waitUntil(t, 15*time.Second, "regiond "+name+" serves /healthz", func() bool {
		select {
		case <-p.done:
			out, _ := os.ReadFile(log.Name())
			t.Fatalf("regiond %s exited:\n%s", name, out)
		default:
		}
		code, _ := httpGet(p.admin + "/healthz")
		return code == http.StatusOK
	})
	return p
}

// kill sends SIGKILL and waits until the process is reaped.
func (p *regiondProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// leader reports whether the replica's /metrics says it holds the
// exchange.
func (p *regiondProc) leader() bool {
	_, body := httpGet(p.admin + "/metrics")
	return strings.Contains(body, "\nration_exchange_leader 1\n")
}

func httpGet(addr string) (int, string) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// freeAddr is a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// shareReader reads eu's applied share from its Redis, as its regiond
// does: the initial third until the exchange wrote one.
func shareReader(t *testing.T, url string) func(context.Context) (int64, error) {
	t.Helper()
	c, err := lease.NewRedisClient(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	st, err := lease.NewRedisStore(c, lease.RedisConfig{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st0, err := region.New(region.Config{Self: "eu", Regions: regions})
	if err != nil {
		t.Fatal(err)
	}
	initial := st0.Initial("eu")
	return func(ctx context.Context) (int64, error) {
		out := []int64{0}
		if err := st.Shares(ctx, []string{key}, out); err != nil {
			return 0, fmt.Errorf("eu's share: %w", err)
		}
		if out[0] < 0 {
			return initial, nil
		}
		return out[0], nil
	}
}
