package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture Go supports (sysconf(_SC_CLK_TCK) is not in syscall).
const clockTicks = 100

// procUsage is what /proc says about one process.
type procUsage struct {
	rss int64   // resident set, bytes (VmRSS)
	cpu float64 // user + system CPU since start, seconds
}

// readProc reads a process's CPU time from /proc/PID/stat and its RSS from
// /proc/PID/status.
func readProc(pid int) (procUsage, error) {
	var u procUsage
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// The command name (field 2) may hold spaces; the fields after it
	// start behind its closing parenthesis: state is field 3, utime 14.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return u, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return u, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return u, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	u.cpu = float64(utime+stime) / clockTicks
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return u, fmt.Errorf("/proc/%d/status: VmRSS %q", pid, v)
			}
			u.rss = kb << 10
		}
	}
	return u, nil
}

// daemonMetrics are the figures the harness takes from regiond's /metrics.
type daemonMetrics struct {
	heapInuse      int64   // go_memstats_heap_inuse_bytes
	epochSum       float64 // ration_exchange_epoch_duration_seconds_sum
	epochCount     int64   // ration_exchange_epoch_duration_seconds_count
	leaseItems     float64 // ration_lease_items_total: keys asked for, one store operation each
	leaseErrors    float64 // ration_store_errors_total: the lease service's failed store calls
	exchangeErrors float64 // ration_exchange_store_errors_total: the exchange's
	saveErrors     float64 // of them, {op="save"}: its persisted state's saves
	stateWritten   float64 // ration_exchange_state_written_bytes_total
}

// scrapeMetrics reads regiond's /metrics in the Prometheus text format
// and sums the samples of the few names it needs over their labels.
func scrapeMetrics(ctx context.Context, hc *http.Client, admin string) (daemonMetrics, error) {
	var m daemonMetrics
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		return m, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return m, fmt.Errorf("scrape %s: %w", admin, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return m, fmt.Errorf("scrape %s: %s", admin, resp.Status)
	}
	return m, parseMetrics(resp.Body, &m)
}

func parseMetrics(r io.Reader, m *daemonMetrics) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, value, ok := sample(line)
		if !ok {
			continue
		}
		switch name {
		case "go_memstats_heap_inuse_bytes":
			m.heapInuse += int64(value)
		case "ration_exchange_epoch_duration_seconds_sum":
			m.epochSum += value
		case "ration_exchange_epoch_duration_seconds_count":
			m.epochCount += int64(value)
		case "ration_lease_items_total":
			m.leaseItems += value
		case "ration_store_errors_total":
			m.leaseErrors += value
		case "ration_exchange_store_errors_total":
			m.exchangeErrors += value
			if strings.Contains(line, `op="save"`) {
				m.saveErrors += value
			}
		case "ration_exchange_state_written_bytes_total":
			m.stateWritten += value
		}
	}
	return sc.Err()
}

// sample splits a text-format line into its metric name (labels dropped)
// and value.
func sample(line string) (string, float64, bool) {
	end := strings.IndexAny(line, "{ ")
	if end < 0 {
		return "", 0, false
	}
	name, rest := line[:end], line[end:]
	if rest[0] == '{' {
		i := strings.LastIndexByte(rest, '}')
		if i < 0 {
			return "", 0, false
		}
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return name, v, err == nil
}

// redisMemory is INFO memory's used_memory and DBSIZE, and what of them
// is the exchange's: its keys and its persisted state's records and bytes.
type redisMemory struct {
	used, keys int64
	// xkeys are the exchange's own keys (its hold and its state), not a
	// key's; xrecords the state's per-key records (its fields less the
	// head), and xbytes MEMORY USAGE's estimate of the state.
	xkeys, xrecords, xbytes int64
}

// storePrefix is regiond's Redis key prefix (lease.RedisConfig's default),
// and exchangeKey a key of the exchange's in region reg, as
// sync/exchange.RedisCoordinator names it.
const storePrefix = "ration:"

func exchangeKey(reg, what string) string { return storePrefix + "exchange:{" + reg + "}:" + what }

// stateSamples is how many of the state's fields MEMORY USAGE looks at to
// estimate the whole: enough for records of similar size, and O(samples)
// rather than O(keys) on a Redis that serves the leases meanwhile.
const stateSamples = 1000

func readRedis(ctx context.Context, rc *redis.Client, reg string) (redisMemory, error) {
	var m redisMemory
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := rc.Info(ctx, "memory").Result()
	if err != nil {
		return m, fmt.Errorf("INFO memory: %w", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			if m.used, err = strconv.ParseInt(v, 10, 64); err != nil {
				return m, fmt.Errorf("INFO memory: used_memory %q", v)
			}
		}
	}
	if m.keys, err = rc.DBSize(ctx).Result(); err != nil {
		return m, fmt.Errorf("DBSIZE: %w", err)
	}
	state := exchangeKey(reg, "state")
	if m.xkeys, err = rc.Exists(ctx, exchangeKey(reg, "lease"), state).Result(); err != nil {
		return m, fmt.Errorf("EXISTS: %w", err)
	}
	if typ, err := rc.Type(ctx, state).Result(); err != nil {
		return m, fmt.Errorf("TYPE %s: %w", state, err)
	} else if typ == "hash" {
		n, err := rc.HLen(ctx, state).Result()
		if err != nil {
			return m, fmt.Errorf("HLEN %s: %w", state, err)
		}
		m.xrecords = max(n-1, 0) // the head is at field ""
	}
	if m.xkeys > 0 {
		m.xbytes, err = rc.MemoryUsage(ctx, state, stateSamples).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return m, fmt.Errorf("MEMORY USAGE %s: %w", state, err)
		}
	}
	return m, nil
}
