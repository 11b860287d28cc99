package redistest

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// The server's reaper goroutine must be gone once each test's cleanup ran.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestServerLifecycle(t *testing.T) {
	s := StartServer(t)
	if err := Ping(s.Addr()); err != nil {
		t.Fatalf("PING after start: %v", err)
	}
	if got, want := s.URL(), "redis://"+s.Addr(); got != want {
		t.Errorf("got URL %q, want %q", got, want)
	}
	s.Stop()
	if err := Ping(s.Addr()); err == nil {
		t.Errorf("PING after Stop: got an answer, want an error")
	}
	s.Stop() // stopping twice is harmless
	s.Restart()
	if err := Ping(s.Addr()); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	s.Pause()
	if err := Ping(s.Addr()); err == nil {
		t.Errorf("PING while paused: got an answer, want a timeout")
	}
	s.Resume()
	if err := Ping(s.Addr()); err != nil {
		t.Errorf("PING after Resume: %v", err)
	}
	s.Pause() // Stop (in cleanup) must kill a paused server too
}

func TestStartPrefersEnv(t *testing.T) {
	t.Setenv(EnvURL, "redis://example.invalid:6379")
	if got := Start(t); got != "redis://example.invalid:6379" {
		t.Errorf("got %q, want the %s value", got, EnvURL)
	}
}

func TestKeyPrefix(t *testing.T) {
	a, b := KeyPrefix(t), KeyPrefix(t)
	if a == b {
		t.Errorf("got the same prefix %q twice, want distinct ones", a)
	}
	t.Run("with {braces} and spaces", func(t *testing.T) {
		p := KeyPrefix(t)
		if strings.ContainsAny(p, "{} ") || !strings.HasPrefix(p, "ration-test:") || !strings.HasSuffix(p, ":") {
			t.Errorf("got prefix %q, want ration-test:<name>:<hex>: without braces or spaces", p)
		}
	})
}
