package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ration-dev/ration/lease/agent"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// needRedis skips the test when redis-server is missing, or fails it
// under CI=true, like the rest of the project's Redis tests.
func needRedis(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server is not on PATH and CI=true: %v", err)
		}
		t.Skipf("redis-server is not on PATH: %v", err)
	}
}

// TestSmallRun runs the whole harness at 2,000 keys for a few report
// intervals, in both output forms, and checks that every interval has its
// lines, that the summary comes last, and that every child process and
// the temp dir are gone once run returns.
func TestSmallRun(t *testing.T) {
	needRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	bin, err := buildRegiond(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-keys", "2000", "-sweep", "2s", "-hot", "200", "-duration", "3500ms", "-report", "1s", "-seed", "1", "-regiond", bin}

	t.Run("json", func(t *testing.T) {
		var out bytes.Buffer
		if err := run(ctx, append(args, "-o", "json"), &out, io.Discard); err != nil {
			t.Fatalf("run: %v\n%s", err, out.String())
		}
		var start startLine
		kinds := map[string]int{}
		var last string
		sc := bufio.NewScanner(&out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var line struct{ Kind string }
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			if line.Kind == "start" {
				if err := json.Unmarshal(sc.Bytes(), &start); err != nil {
					t.Fatal(err)
				}
			}
			kinds[line.Kind]++
			last = line.Kind
		}
		// Three ticks within 3.5s and the final interval at its end; a
		// loaded machine may drop a tick while a sample is taken.
		if kinds["start"] != 1 || kinds["all"] < 2 || kinds["region"] != 3*kinds["all"] || kinds["summary"] != 1 || last != "summary" {
			t.Errorf("got lines %v ending with %q, want one start, ≥ 2 intervals of 3 regions and 1 all, and the summary last", kinds, last)
		}
		checkGone(t, start)
	})

	t.Run("text", func(t *testing.T) {
		var out bytes.Buffer
		if err := run(ctx, args, &out, io.Discard); err != nil {
			t.Fatalf("run: %v\n%s", err, out.String())
		}
		text := out.String()
		for _, want := range []string{"active keys 2000", "\n  ap ", "\n  eu ", "\n  us ", "agents: ", "summary: t="} {
			if !strings.Contains(text, want) {
				t.Errorf("output lacks %q:\n%s", want, text)
			}
		}
	})
}

// checkGone fails unless every process of the run has been reaped and its
// temp dir removed.
func checkGone(t *testing.T, start startLine) {
	t.Helper()
	if len(start.PIDs) != 6 {
		t.Errorf("got pids %v, want a regiond and a redis-server in each of 3 regions", start.PIDs)
	}
	for name, pid := range start.PIDs {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) still exists after run returned: kill -0 gave %v", name, pid, err)
		}
	}
	if _, err := os.Stat(start.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir %s: got %v, want it removed", start.Dir, err)
	}
}

func TestParseRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-keys", "0"}, {"-sweep", "60s"}, {"-sweep", "0s"}, {"-zipf", "1"}, {"-move", "1.5"},
		{"-hot", "-1"}, {"-o", "yaml"}, {"-agents", "0"}, {"-workers", "0"}, {"-report", "0s"}, {"-store-timeout", "-1s"}, {"extra"},
		{"-redis-layout", "rows"}, {"-redis-groups", "1000"}, {"-redis-groups", "1024", "-redis-layout", "keys"},
		{"-heap-profiles", "x", "-regiond", "y"},
		{"-sweep", "2m", "-idle-after", "2m"}, {"-first-sweep", "-1s"}, {"-first-sweep", "51s"},
	} {
		if _, err := parse(args, io.Discard); err == nil {
			t.Errorf("parse(%q): got no error", args)
		} else if name := strings.TrimPrefix(args[0], "-"); args[0] != "extra" && !strings.Contains(err.Error(), name) {
			t.Errorf("parse(%q): %v does not name %s", args, err, name)
		}
	}
}

func TestHomeMovesTheShareAsked(t *testing.T) {
	g := newGenerator(loadConfig{keys: 100_000, move: 0.1, seed: 7}, make([][]*agent.Agent, 3))
	moved := 0
	for k := range uint32(100_000) {
		if g.home(k, 0) != g.home(k, 1) {
			moved++
		}
	}
	if moved < 9_000 || moved > 11_000 {
		t.Errorf("got %d of 100,000 keys moving home between rounds, want about 10,000", moved)
	}
}

func TestParseMetricsSumsOverLabels(t *testing.T) {
	text := `# HELP go_memstats_heap_inuse_bytes x
# TYPE go_memstats_heap_inuse_bytes gauge
go_memstats_heap_inuse_bytes 1.5e+07
ration_exchange_epoch_duration_seconds_bucket{le="0.5"} 3
ration_exchange_epoch_duration_seconds_sum 1.25
ration_exchange_epoch_duration_seconds_count 5
ration_lease_items_total{rule="per-user"} 10
ration_lease_items_total{rule="other"} 5
ration_store_errors_total{op="lease"} 2
ration_exchange_store_errors_total{op="shares"} 3
ration_exchange_store_errors_total{op="hold"} 4
ration_exchange_store_errors_total{op="save"} 1
ration_exchange_state_written_bytes_total 2048
ration_exchange_share_writes_total{op="set"} 700
ration_exchange_share_writes_total{op="delete"} 20
`
	var got daemonMetrics
	if err := parseMetrics(strings.NewReader(text), &got); err != nil {
		t.Fatal(err)
	}
	want := daemonMetrics{heapInuse: 15e6, epochSum: 1.25, epochCount: 5, leaseItems: 15, leaseErrors: 2, exchangeErrors: 8, saveErrors: 1, stateWritten: 2048, shareWrites: 720}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestCountersRateOverTheInterval(t *testing.T) {
	var c counters
	steps := []struct {
		dt, cur, want float64
	}{
		{0, 100, 0},   // first sample: no interval yet
		{2, 140, 20},  // 40 over 2s
		{2, 10, 0},    // went down (a new connection): unchanged
		{0.5, 20, 20}, // 10 over 0.5s
	}
	for i, st := range steps {
		c.dt = st.dt
		if got := c.rate("x", st.cur); got != st.want {
			t.Errorf("step %d: got rate %v, want %v", i, got, st.want)
		}
	}
}

func TestRegiondAddrs(t *testing.T) {
	path := t.TempDir() + "/out"
	line := "regiond eu: lease API on 127.0.0.1:4001, admin on http://127.0.0.1:4002 (/healthz /readyz /metrics)\n"
	if err := os.WriteFile(path, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	lease, admin := regiondAddrs(path)
	if lease != "127.0.0.1:4001" || admin != "127.0.0.1:4002" {
		t.Errorf("got lease %q admin %q, want 127.0.0.1:4001 and 127.0.0.1:4002", lease, admin)
	}
}

// TestFirstSweep checks the sweep's schedule with a faster first pass:
// every key is due once in the first pass, then once a sweep, so no key
// waits longer than a sweep between two requests.
func TestFirstSweep(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	g := &generator{cfg: loadConfig{keys: 100, sweep: 50 * time.Second, first: 10 * time.Second}, start: start}
	for _, c := range []struct {
		at   time.Duration
		want int64
	}{{0, 0}, {5 * time.Second, 50}, {10 * time.Second, 100}, {35 * time.Second, 150}, {60 * time.Second, 200}} {
		if got := g.due(start.Add(c.at)); got != c.want {
			t.Errorf("due at %v: got %d, want %d", c.at, got, c.want)
		}
	}
	// The time from a key's first request to its second, for every key.
	dueAt := func(s int64) time.Duration { // the first time s keys are due
		lo, hi := time.Duration(0), 2*time.Minute
		for hi-lo > time.Millisecond {
			mid := (lo + hi) / 2
			if g.due(start.Add(mid)) >= s {
				hi = mid
			} else {
				lo = mid
			}
		}
		return hi
	}
	for k := int64(0); k < 100; k++ {
		if gap := dueAt(k+101) - dueAt(k+1); gap > g.cfg.sweep+time.Millisecond {
			t.Errorf("key %d: %v between its first two requests, want at most the sweep %v", k, gap, g.cfg.sweep)
		}
	}
}
