// Package redistest finds or starts a real redis-server for tests.
//
// Start returns the URL of a Redis to test against: RATION_REDIS_URL when it
// is set (a shared server: use KeyPrefix for distinct keys and flush
// nothing), else a redis-server started for the test on a free loopback
// port, without persistence, and killed when the test ends, else, when a
// Docker engine is reachable, a Redis container started through
// testcontainers-go; the choice is logged once per test binary. StartServer
// always starts one, for tests that stop, pause or restart it; StartCluster
// starts a small Redis Cluster; StartSentinel a primary, a replica and three
// sentinels (quorum 2) for failover tests.
//
// When none of those is available, tests fail if CI=true and are skipped
// otherwise.
package redistest

import (
	"bufio"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// EnvURL names the environment variable that points tests at an existing
// Redis (a redis:// URL, or a comma-separated cluster address list).
const EnvURL = "RATION_REDIS_URL"

// readyTimeout bounds how long a new server may take to answer PING; it
// is generous because race-enabled test binaries share a small machine.
const readyTimeout = 10 * time.Second

// Start returns a Redis URL for t: RATION_REDIS_URL if set, else the URL
// of a redis-server started for t (see StartServer), else that of a
// container (testcontainers-go) when a Docker engine is reachable.
func Start(t testing.TB) string {
	t.Helper()
	switch theSource(t) {
	case sourceEnv:
		return os.Getenv(EnvURL)
	case sourceLocal:
		return StartServer(t).URL()
	case sourceContainer:
		return startContainer(t)
	}
	noRedis(t)
	return ""
}

// KeyPrefix returns a key prefix unique to this test run, for tests that
// share a server: "ration-test:<test name>:<random>:". It contains no
// braces, so it never disturbs a Cluster hash tag.
func KeyPrefix(t testing.TB) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("redistest: random prefix: %v", err)
	}
	name := strings.Map(func(r rune) rune {
		switch r {
		case '{', '}', ' ', ':':
			return '_'
		}
		return r
	}, t.Name())
	return "ration-test:" + name + ":" + hex.EncodeToString(b[:]) + ":"
}

// Server is a redis-server process started for one test. Its methods are
// meant for the test's own goroutine.
type Server struct {
	t     testing.TB
	bin   string
	dir   string
	port  int
	extra []string // more redis-server arguments
	tls   *TLS     // nil: plain TCP

	proc *process // nil while stopped
}

// StartServer starts a redis-server on a free 127.0.0.1 port with
// --save "" --appendonly no, waits until it answers PING, and stops it
// when the test ends.
func StartServer(t testing.TB) *Server {
	t.Helper()
	return startServer(t)
}

func startServer(t testing.TB, extra ...string) *Server {
	t.Helper()
	return startPending(t, extra).run()
}

// startPending finds redis-server (or skips, or fails under CI) and
// returns a Server not started yet.
func startPending(t testing.TB, extra []string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		// A process is what these tests stop, pause and restart: neither
		// RATION_REDIS_URL nor a container stands in for it.
		msg := "redistest: redis-server not found in PATH"
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s: install redis-server (Debian package redis-server)", msg)
		}
		t.Skipf("%s: skipping a test that needs a real Redis", msg)
	}
	return &Server{t: t, bin: bin, dir: t.TempDir(), extra: extra}
}

// run starts s, on a free port, and stops it when the test ends.
func (s *Server) run() *Server {
	t := s.t
	t.Helper()
	t.Cleanup(s.Stop)
	// A port found free can be taken before redis binds it; try a few.
	for attempt := 0; ; attempt++ {
		s.port = freePort(t)
		err := s.start()
		if err == nil {
			return s
		}
		if attempt == 4 {
			t.Fatalf("redistest: %v", err)
		}
	}
}

// TLS makes StartTLSServer's server speak TLS only, with these PEM files
// (CA verifies client certificates, which it requires), and ping it with
// Client, a client configuration its CA trusts.
type TLS struct {
	Cert, Key, CA string
	Client        *tls.Config
}

// StartTLSServer is StartServer for a redis-server that serves TLS only
// (--port 0 --tls-port), requiring client certificates; extra are more
// redis-server arguments (an ACL user, say). URL is rediss://.
func StartTLSServer(t testing.TB, tl TLS, extra ...string) *Server {
	t.Helper()
	s := startPending(t, extra)
	s.tls = &tl
	return s.run()
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is the server's redis:// URL (rediss:// over TLS).
func (s *Server) URL() string {
	if s.tls != nil {
		return "rediss://" + s.Addr()
	}
	return "redis://" + s.Addr()
}

// Stop kills the server (SIGKILL: a crash, not a shutdown) and waits for
// it to exit. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	if s.proc == nil {
		return
	}
	s.proc.kill()
	s.proc = nil
}

// Restart starts a stopped server again on the same port, with an empty
// dataset (nothing is persisted), and waits until it answers PING. It
// stops a running server first.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
}

// Pause freezes the server (SIGSTOP): connections stay open and the kernel
// still accepts new ones, but nothing is answered, like a hung node.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume undoes Pause (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	if s.proc == nil {
		s.t.Fatalf("redistest: signal %v to a stopped server", sig)
	}
	if err := s.proc.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: signal %v: %v", sig, err)
	}
}

// start runs redis-server on s.port and waits for PING.
func (s *Server) start() error {
	logPath := filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", s.port))
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	args := []string{"--port", strconv.Itoa(s.port)}
	if s.tls != nil {
		args = []string{"--port", "0", "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", s.tls.Cert, "--tls-key-file", s.tls.Key, "--tls-ca-cert-file", s.tls.CA, "--tls-auth-clients", "yes"}
	}
	args = append(args,
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
	)
	p, err := spawn(exec.Command(s.bin, append(args, s.extra...)...), log, logPath, "redis-server", s.port, s.ping)
	if err != nil {
		return err
	}
	s.proc = p
	return nil
}

// process is a started redis-server (or sentinel) and its reaper.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has exited and been reaped
	log  *os.File
}

// spawn starts cmd with its output in log (at logPath) and waits until
// ping succeeds, failing if the process exits first or readyTimeout
// passes (then it is killed). On error log is closed.
func spawn(cmd *exec.Cmd, log *os.File, logPath, what string, port int, ping func() error) (*process, error) {
	// An *os.File needs no copying goroutine; the log is read on failure.
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("start %s: %w", what, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{}), log: log}
	// Reaps the process; owned by p and finished by kill.
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	deadline := time.Now().Add(readyTimeout)
	for {
		if ping() == nil {
			return p, nil
		}
		select {
		case <-p.done:
			_ = log.Close()
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("%s on port %d exited before answering PING:\n%s", what, port, out)
		case <-time.After(5 * time.Millisecond): // poll interval
		}
		if time.Now().After(deadline) {
			p.kill()
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("%s on port %d did not answer PING within %v:\n%s", what, port, readyTimeout, out)
		}
	}
}

// kill kills the process (SIGKILL), waits until it is reaped and closes
// its log.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
	_ = p.log.Close()
}

// ping is Ping, over TLS for a TLS server.
func (s *Server) ping() error {
	if s.tls == nil {
		return Ping(s.Addr())
	}
	cfg := s.tls.Client.Clone()
	cfg.ServerName = "127.0.0.1"
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 100 * time.Millisecond}, "tcp", s.Addr(), cfg)
	if err != nil {
		return err
	}
	return ping(c)
}

// Ping sends one PING and expects +PONG, speaking RESP directly so that
// readiness does not depend on a client library's retry behaviour.
func Ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err != nil {
		return err
	}
	return ping(c)
}

func ping(c net.Conn) error {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
