package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"
)

// TestBinaryServesAndStopsOnSIGTERM builds regiond, starts it with no
// store or policy flags (the embedded defaults) on free loopback ports,
// checks /readyz, and checks that SIGTERM makes it exit 0.
func TestBinaryServesAndStopsOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := filepath.Join(t.TempDir(), "regiond")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("go build: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-log-level", "warn")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the first line: %v", err)
	}
	m := regexp.MustCompile(`lease API on (\S+), admin on http://(\S+) `).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("got first line %q, want where it listens", line)
	}
	resp, err := http.Get("http://" + m[2] + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/readyz: got %d %q, want 200", resp.StatusCode, body)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v, want exit status 0", err)
	}
}

// TestExchangeFlagsAreValidated checks that contradictory exchange flags
// stop regiond before it binds anything.
func TestExchangeFlagsAreValidated(t *testing.T) {
	for _, args := range [][]string{
		{"-nats", "nats://127.0.0.1:1", "-nats-embedded"},
		{"-region", "eu", "-regions", "us,ap", "-nats-embedded"},
		{"-region", "eu", "-regions", "eu,eu"},
		{"-sync-period", "1us", "-nats-embedded"},
		{"-idle-after", "-1s", "-nats-embedded"},
		{"-redis-layout", "rows", "-redis", "redis://127.0.0.1:1"},
		{"-redis-layout", "groups"}, // without -redis
		{"-redis-groups", "1000", "-redis-layout", "groups", "-redis", "redis://127.0.0.1:1"},
	} {
		if err := run(append(args, "-listen", "127.0.0.1:0", "-admin", "-")); err == nil {
			t.Errorf("run(%q): got nil, want an error", args)
		}
	}
}

// TestRLQSFlagNeedsTLSBeyondLoopback: -rlqs-listen on an address that is
// not loopback, without TLS or -insecure, stops regiond before it binds.
func TestRLQSFlagNeedsTLSBeyondLoopback(t *testing.T) {
	if err := run([]string{"-rlqs-listen", ":0", "-listen", "127.0.0.1:0", "-admin", "-"}); err == nil {
		t.Error("got nil, want an error")
	}
}
