package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Cluster is a Redis Cluster of masters without replicas, started for one
// test: enough to check that keys of one batch in different slots work
// and that a key's hash tag keeps its state in one slot.
type Cluster struct {
	Servers []*Server
}

// StartCluster starts n ≥ 1 redis-server processes in cluster mode on free
// 127.0.0.1 ports, splits the 16384 slots evenly between them, joins them,
// and waits until every node reports cluster_state:ok. They are stopped
// when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("redistest: a cluster of %d nodes", n)
	}
	c := &Cluster{}
	for i := range n {
		s := startServer(t, "--cluster-enabled", "yes",
			"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", i),
			"--cluster-node-timeout", "5000")
		c.Servers = append(c.Servers, s)
	}
	const slots = 16384
	for i, s := range c.Servers {
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if _, err := command(s.Addr(), "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
			t.Fatalf("redistest: assign slots %d-%d to %s: %v", lo, hi, s.Addr(), err)
		}
		if i > 0 {
			if _, err := command(s.Addr(), "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(c.Servers[0].port)); err != nil {
				t.Fatalf("redistest: join %s: %v", s.Addr(), err)
			}
		}
	}
	deadline := time.Now().Add(readyTimeout)
	for _, s := range c.Servers {
		for {
			info, err := command(s.Addr(), "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster node %s not ready within %v: %v\n%s", s.Addr(), readyTimeout, err, info)
			}
			time.Sleep(10 * time.Millisecond) // poll interval while the nodes gossip
		}
	}
	return c
}

// Addrs is the comma-separated list of the nodes' host:port, the form
// that lease.NewRedisClient takes for a cluster.
func (c *Cluster) Addrs() string {
	addrs := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		addrs[i] = s.Addr()
	}
	return strings.Join(addrs, ",")
}

// command sends one command in RESP and returns a simple, integer or bulk
// string reply; an error reply is an error.
func command(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	switch {
	case line == "":
		return "", fmt.Errorf("empty reply")
	case line[0] == '+' || line[0] == ':':
		return line[1:], nil
	case line[0] == '-':
		return "", fmt.Errorf("%s", line[1:])
	case line[0] == '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("bad bulk reply %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}
