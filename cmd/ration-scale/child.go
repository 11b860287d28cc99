package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ration-dev/ration/internal/redistest"
)

// readyTimeout bounds how long a child may take to answer (redis PING,
// regiond /readyz).
const readyTimeout = 30 * time.Second

// pollEvery is how often a starting child is checked, within readyTimeout.
const pollEvery = 20 * time.Millisecond

// child is a process the harness started and must stop. Its output goes to
// files in the run's temp dir, so that no goroutine copies it.
type child struct {
	name    string
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has been reaped
	outPath string
	errPath string
}

// startChild starts bin with args, stdout and stderr into dir/name.out and
// dir/name.err.
func startChild(dir, name string, env []string, bin string, args ...string) (*child, error) {
	c := &child{
		name:    name,
		done:    make(chan struct{}),
		outPath: filepath.Join(dir, name+".out"),
		errPath: filepath.Join(dir, name+".err"),
	}
	out, err := os.Create(c.outPath)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	errf, err := os.Create(c.errPath)
	if err != nil {
		return nil, err
	}
	defer errf.Close()
	c.cmd = exec.Command(bin, args...)
	c.cmd.Stdout, c.cmd.Stderr = out, errf
	if len(env) > 0 {
		c.cmd.Env = append(os.Environ(), env...)
	}
	// Should the harness itself be killed, the kernel kills its children.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	// Reaps the process; owned by c and finished by stop.
	go func() {
		_ = c.cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// pid is the child's process id.
func (c *child) pid() int { return c.cmd.Process.Pid }

// exited reports whether the process has ended.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to grace for the process to exit and kills
// it after that. It returns once the process has been reaped.
func (c *child) stop(grace time.Duration) {
	if c.exited() {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// failure describes a child that did not come up, with the end of its
// output.
func (c *child) failure(what string) error {
	tail := func(p string) string {
		b, _ := os.ReadFile(p)
		if len(b) > 2000 {
			b = b[len(b)-2000:]
		}
		return string(bytes.TrimSpace(b))
	}
	state := "still running"
	if c.exited() {
		state = "exited: " + c.cmd.ProcessState.String()
	}
	return fmt.Errorf("%s %s (%s)\nstdout: %s\nstderr: %s", c.name, what, state, tail(c.outPath), tail(c.errPath))
}

// waitFor polls cond until it holds, the child exits or readyTimeout
// passes.
func (c *child) waitFor(ctx context.Context, what string, cond func() bool) error {
	deadline := time.Now().Add(readyTimeout)
	for !cond() {
		if c.exited() {
			return c.failure(what)
		}
		if time.Now().After(deadline) {
			return c.failure(what + " within " + readyTimeout.String())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollEvery):
		}
	}
	return nil
}

// startRedis starts a redis-server from PATH on a free loopback port,
// without persistence, and waits until it answers PING.
func startRedis(ctx context.Context, dir, name string) (*child, string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", errors.New("redis-server is not on PATH: install it (apt-get install redis-server, brew install redis) or put it on PATH")
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	rdir := filepath.Join(dir, name)
	if err := os.Mkdir(rdir, 0o755); err != nil {
		return nil, "", err
	}
	c, err := startChild(dir, name, nil, bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", rdir, "--daemonize", "no")
	if err != nil {
		return nil, "", err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := c.waitFor(ctx, "did not answer PING", func() bool { return redistest.Ping(addr) == nil }); err != nil {
		c.stop(time.Second)
		return nil, "", err
	}
	return c, addr, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// regiondProc is a running regiond and the addresses it printed.
type regiondProc struct {
	*child
	region, lease, admin string
	pprof                string // its pprof server (pprofSource), or ""
}

// startRegiond execs the regiond binary and waits until it has printed
// its addresses; waitReady waits for its /readyz. A regiond is ready only
// once it has heard every other region (or its grace passed), so start
// them all before waiting for any.
// With withPprof, a regiond built with pprofSource serves pprof on a free
// loopback port.
func startRegiond(ctx context.Context, dir, bin string, args []string, region string, withPprof bool) (*regiondProc, error) {
	var env []string
	var pprofAddr string
	if withPprof {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		pprofAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		env = []string{pprofEnv + "=" + pprofAddr}
	}
	c, err := startChild(dir, "regiond-"+region, env, bin, args...)
	if err != nil {
		return nil, err
	}
	p := &regiondProc{child: c, region: region, pprof: pprofAddr}
	err = c.waitFor(ctx, "did not print its addresses", func() bool {
		p.lease, p.admin = regiondAddrs(c.outPath)
		return p.admin != ""
	})
	if err != nil {
		c.stop(time.Second)
		return nil, err
	}
	return p, nil
}

// waitReady waits until p answers /readyz with 200.
func (p *regiondProc) waitReady(ctx context.Context) error {
	hc := &http.Client{Timeout: time.Second}
	return p.waitFor(ctx, "did not answer /readyz", func() bool {
		resp, err := hc.Get("http://" + p.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// regiondAddrs reads the lease and admin addresses from regiond's first
// line: "regiond eu: lease API on ADDR, admin on http://ADDR (...)".
func regiondAddrs(outPath string) (lease, admin string) {
	b, err := os.ReadFile(outPath)
	if err != nil {
		return "", ""
	}
	line, _, ok := strings.Cut(string(b), "\n")
	if !ok {
		return "", ""
	}
	_, rest, ok := strings.Cut(line, "lease API on ")
	if !ok {
		return "", ""
	}
	lease, rest, ok = strings.Cut(rest, ", admin on http://")
	if !ok {
		return "", ""
	}
	admin, _, _ = strings.Cut(rest, " ")
	return lease, admin
}

// buildRegiond builds cmd/regiond of this module into dir.
func buildRegiond(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "regiond")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/ration-dev/ration/cmd/regiond")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build regiond (run from within the ration module): %w\n%s", err, out)
	}
	return bin, nil
}
