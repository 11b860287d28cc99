package redistest

import (
	"context"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// containerImage is the image Start runs when it must use a container.
const containerImage = "redis:7-alpine"

// source is where Start gets its Redis from.
type source int

const (
	sourceNone      source = iota // nothing usable: skip, or fail under CI
	sourceEnv                     // RATION_REDIS_URL
	sourceLocal                   // a redis-server on PATH, one per test
	sourceContainer               // a container through testcontainers-go
)

func (s source) String() string {
	return [...]string{"none", EnvURL, "a local redis-server", "a testcontainers-go container (" + containerImage + ")"}[s]
}

// probes are what choose looks at, injected so that its order can be
// tested without the environment it describes.
type probes struct {
	env      func(string) string
	lookPath func(string) (string, error)
	docker   func() bool // a Docker engine answers
}

// choose picks Start's source: RATION_REDIS_URL when set, else a local
// redis-server, else a container when a Docker engine is reachable.
func choose(p probes) source {
	switch {
	case p.env(EnvURL) != "":
		return sourceEnv
	case func() bool { _, err := p.lookPath("redis-server"); return err == nil }():
		return sourceLocal
	case p.docker():
		return sourceContainer
	}
	return sourceNone
}

var (
	chooseOnce sync.Once
	chosen     source
)

// theSource is choose over the real environment, decided and logged once
// per test binary.
func theSource(t testing.TB) source {
	t.Helper()
	chooseOnce.Do(func() {
		chosen = choose(probes{env: os.Getenv, lookPath: exec.LookPath, docker: func() bool { return dockerReachable(os.Getenv) }})
		t.Logf("redistest: tests get Redis from %v", chosen)
	})
	return chosen
}

// dockerReachable reports whether a Docker engine answers a dial: at
// DOCKER_HOST (unix:// or tcp://) when set, else at the default socket.
// A dial, not an API call: it only decides whether to try testcontainers,
// which reports anything worse itself.
func dockerReachable(env func(string) string) bool {
	network, addr := "unix", "/var/run/docker.sock"
	if h := env("DOCKER_HOST"); h != "" {
		u, err := url.Parse(h)
		if err != nil {
			return false
		}
		switch u.Scheme {
		case "unix":
			addr = u.Path
		case "tcp":
			network, addr = "tcp", u.Host
		default:
			return false
		}
	}
	c, err := net.DialTimeout(network, addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// noRedis skips t, or fails it under CI=true, for want of any Redis.
func noRedis(t testing.TB) {
	t.Helper()
	msg := "redistest: redis-server not found in PATH, " + EnvURL + " is unset and no Docker engine is reachable"
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: install redis-server (Debian package redis-server)", msg)
	}
	t.Skipf("%s: skipping a test that needs a real Redis", msg)
}

// startContainer runs containerImage without persistence through
// testcontainers-go and returns its redis:// URL; the container is removed
// when the test ends.
func startContainer(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a first pull is slow
	defer cancel()
	c, err := testcontainers.Run(ctx, containerImage,
		testcontainers.WithExposedPorts("6379/tcp"),
		testcontainers.WithCmd("redis-server", "--save", "", "--appendonly", "no"),
		testcontainers.WithWaitStrategy(wait.ForListeningPort("6379/tcp")),
	)
	t.Cleanup(func() {
		if err := testcontainers.TerminateContainer(c); err != nil {
			t.Errorf("redistest: remove the Redis container: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("redistest: start a Redis container: %v", err)
	}
	host, err := c.Host(ctx)
	if err != nil {
		t.Fatalf("redistest: the Redis container's host: %v", err)
	}
	port, err := c.MappedPort(ctx, "6379/tcp")
	if err != nil {
		t.Fatalf("redistest: the Redis container's port: %v", err)
	}
	return "redis://" + net.JoinHostPort(strings.Trim(host, "[]"), port.Port())
}
