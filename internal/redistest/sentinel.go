package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SentinelMaster is the master name StartSentinel's sentinels monitor.
const SentinelMaster = "ration"

// Sentinel is a Redis replicated under Sentinel, started for one test: a
// primary, one replica and three sentinels on loopback, quorum 2. Stop
// the Primary and the sentinels promote the Replica within a few seconds
// (down-after-milliseconds 500, failover-timeout 3000).
type Sentinel struct {
	Primary, Replica *Server
	sentinels        []*sentinelProc
}

// StartSentinel starts the setup and waits until it is whole: the replica
// in sync with the primary, and every sentinel naming the primary as the
// master and knowing the replica and the two other sentinels, which a
// failover needs. Everything is stopped when the test ends. Like
// StartServer, it skips (or fails under CI=true) without redis-server.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	// Without a delay before a diskless full sync (5s by default) the
	// replica is in sync in milliseconds; either may be the master later.
	noDelay := []string{"--repl-diskless-sync-delay", "0"}
	s := &Sentinel{Primary: startServer(t, noDelay...)}
	s.Replica = startServer(t, append(noDelay, "--replicaof", "127.0.0.1", strconv.Itoa(s.Primary.port))...)
	deadline := time.Now().Add(readyTimeout)
	waitUntil(t, deadline, "replica "+s.Replica.Addr()+" in sync", func() (bool, error) {
		info, err := command(s.Replica.Addr(), "INFO", "replication")
		return strings.Contains(info, "master_link_status:up"), err
	})
	for i := range 3 {
		s.sentinels = append(s.sentinels, startSentinelProc(t, s.Primary.port, i))
	}
	for _, p := range s.sentinels {
		waitUntil(t, deadline, "sentinel "+p.addr()+" ready", func() (bool, error) {
			m, err := sentinelMaster(p.addr())
			if err != nil {
				return false, err
			}
			return m["port"] == strconv.Itoa(s.Primary.port) && m["num-slaves"] == "1" &&
				m["num-other-sentinels"] == "2" && !strings.Contains(m["flags"], "down"), nil
		})
	}
	return s
}

// Addrs is the sentinels' host:port list, comma-separated.
func (s *Sentinel) Addrs() string {
	addrs := make([]string, len(s.sentinels))
	for i, p := range s.sentinels {
		addrs[i] = p.addr()
	}
	return strings.Join(addrs, ",")
}

// URL is the setup's redis-sentinel:// address, for lease.NewRedisClient.
func (s *Sentinel) URL() string {
	return "redis-sentinel://" + s.Addrs() + "/" + SentinelMaster
}

// MasterAddr is the master's host:port as a majority of the sentinels
// name it; "" while they do not agree.
func (s *Sentinel) MasterAddr() string {
	votes := map[string]int{}
	for _, p := range s.sentinels {
		r, err := roundTrip(p.addr(), "SENTINEL", "get-master-addr-by-name", SentinelMaster)
		if a, ok := r.([]any); ok && err == nil && len(a) == 2 {
			h, _ := a[0].(string)
			port, _ := a[1].(string)
			votes[net.JoinHostPort(h, port)]++
		}
	}
	for addr, n := range votes {
		if 2*n > len(s.sentinels) {
			return addr
		}
	}
	return ""
}

// WaitPromoted waits until the sentinels name the replica as the master
// and it says it is one, and returns how long that took; it fails the
// test after within.
func (s *Sentinel) WaitPromoted(t testing.TB, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	waitUntil(t, start.Add(within), "replica "+s.Replica.Addr()+" promoted", func() (bool, error) {
		if s.MasterAddr() != s.Replica.Addr() {
			return false, nil
		}
		info, err := command(s.Replica.Addr(), "INFO", "replication")
		return strings.Contains(info, "role:master"), err
	})
	return time.Since(start)
}

// RunID is the run_id of a server's INFO: what lease's Incarnation reads.
func RunID(t testing.TB, s *Server) string {
	t.Helper()
	info, err := command(s.Addr(), "INFO", "server")
	if err != nil {
		t.Fatalf("redistest: INFO server of %s: %v", s.Addr(), err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v
		}
	}
	t.Fatalf("redistest: INFO server of %s has no run_id", s.Addr())
	return ""
}

// CutReplication stops the replica from receiving the primary's stream,
// as a network fault would: it closes the link (CLIENT KILL TYPE replica
// on the primary) and first gives the replica a masterauth the primary
// refuses, so that its reconnections fail. Every write from then on is
// lost if the primary dies: the writes asynchronous replication had not
// delivered. Sentinel still counts the replica as up and may promote it.
func (s *Sentinel) CutReplication(t testing.TB) {
	t.Helper()
	if _, err := command(s.Replica.Addr(), "CONFIG", "SET", "masterauth", "refused-by-the-primary"); err != nil {
		t.Fatalf("redistest: set the replica's masterauth: %v", err)
	}
	if _, err := command(s.Primary.Addr(), "CLIENT", "KILL", "TYPE", "replica"); err != nil {
		t.Fatalf("redistest: close the replication link: %v", err)
	}
	waitUntil(t, time.Now().Add(readyTimeout), "replica "+s.Replica.Addr()+" cut off", func() (bool, error) {
		info, err := command(s.Replica.Addr(), "INFO", "replication")
		return strings.Contains(info, "master_link_status:down"), err
	})
}

// ReplOffset is the master_repl_offset of a server's INFO replication:
// the bytes of the replication stream it has produced (a primary) or
// received (a replica).
func ReplOffset(t testing.TB, s *Server) int64 {
	t.Helper()
	info, err := command(s.Addr(), "INFO", "replication")
	if err != nil {
		t.Fatalf("redistest: INFO replication of %s: %v", s.Addr(), err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "master_repl_offset:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("redistest: master_repl_offset %q of %s: %v", v, s.Addr(), err)
			}
			return n
		}
	}
	t.Fatalf("redistest: INFO replication of %s has no master_repl_offset", s.Addr())
	return 0
}

// waitUntil polls cond until it holds, failing t at deadline with cond's
// last error.
func waitUntil(t testing.TB, deadline time.Time, what string, cond func() (bool, error)) {
	t.Helper()
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: %s: not within the deadline (last error: %v)", what, err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval while the processes talk
	}
}

// sentinelMaster is SENTINEL MASTER's field map.
func sentinelMaster(addr string) (map[string]string, error) {
	r, err := roundTrip(addr, "SENTINEL", "MASTER", SentinelMaster)
	if err != nil {
		return nil, err
	}
	a, ok := r.([]any)
	if !ok || len(a)%2 != 0 {
		return nil, fmt.Errorf("SENTINEL MASTER answered %v", r)
	}
	m := map[string]string{}
	for i := 0; i < len(a); i += 2 {
		k, _ := a[i].(string)
		v, _ := a[i+1].(string)
		m[k] = v
	}
	return m, nil
}

// sentinelProc is one redis-server --sentinel. Server cannot run it: a
// sentinel needs its (writable) configuration file as the first argument.
type sentinelProc struct {
	port int
	proc *process // nil once stopped
}

func (p *sentinelProc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// startSentinelProc starts sentinel i monitoring the primary on
// primaryPort and waits until it answers PING; it is killed when the test
// ends. A port taken between finding and binding it is tried again.
func startSentinelProc(t testing.TB, primaryPort, i int) *sentinelProc {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: %v", err) // startServer found it a moment ago
	}
	dir := t.TempDir()
	for attempt := 0; ; attempt++ {
		p := &sentinelProc{port: freePort(t)}
		err := p.start(bin, dir, primaryPort, i)
		if err == nil {
			t.Cleanup(p.stop)
			return p
		}
		if attempt == 4 {
			t.Fatalf("redistest: sentinel %d: %v", i, err)
		}
	}
}

func (p *sentinelProc) start(bin, dir string, primaryPort, i int) error {
	// %[3]s is the master name again.
	conf := filepath.Join(dir, fmt.Sprintf("sentinel-%d.conf", p.port))
	text := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
daemonize no
sentinel resolve-hostnames no
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %[3]s 500
sentinel failover-timeout %[3]s 3000
sentinel parallel-syncs %[3]s 1
`, p.port, dir, SentinelMaster, primaryPort)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return err
	}
	logPath := filepath.Join(dir, fmt.Sprintf("sentinel-%d.log", p.port))
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	proc, err := spawn(exec.Command(bin, conf, "--sentinel"), log, logPath, "sentinel", p.port, func() error { return Ping(p.addr()) })
	if err != nil {
		return err
	}
	p.proc = proc
	return nil
}

func (p *sentinelProc) stop() {
	if p.proc == nil {
		return
	}
	p.proc.kill()
	p.proc = nil
}

// roundTrip sends one command in RESP and reads its whole reply: a string
// (simple or bulk), an int64, nil, or a []any of those; an error reply is
// an error.
func roundTrip(addr string, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return nil, err
	}
	return readReply(bufio.NewReader(conn), 0)
}

func readReply(r *bufio.Reader, depth int) (any, error) {
	if depth > 4 {
		return nil, fmt.Errorf("reply nested too deep")
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, fmt.Errorf("empty reply")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, fmt.Errorf("%s", line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < -1 {
			return nil, fmt.Errorf("bad bulk reply %q", line)
		}
		if n == -1 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < -1 || n > 1<<16 {
			return nil, fmt.Errorf("bad array reply %q", line)
		}
		if n == -1 {
			return nil, nil
		}
		a := make([]any, n)
		for i := range a {
			if a[i], err = readReply(r, depth+1); err != nil {
				return nil, err
			}
		}
		return a, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}
