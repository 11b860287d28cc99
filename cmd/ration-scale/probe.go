package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
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

// loadAverage is the machine's one-minute load average (/proc/loadavg):
// the run shares the machine, and a loaded one shows in every figure.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
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
	shareWrites    float64 // ration_exchange_share_writes_total: shares written (or deleted) by the exchange
	shareDeferred  float64 // ration_exchange_share_writes_deferred_total: share writes left for a later epoch
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
		case "ration_exchange_share_writes_total":
			m.shareWrites += value
		case "ration_exchange_share_writes_deferred_total":
			m.shareDeferred += value
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

// redisMemory is what one Redis holds for ration: INFO memory's
// used_memory, and the keys' entries and the exchange's records counted in
// Redis itself, in either of regiond's layouts.
type redisMemory struct {
	used, dbsize int64
	// own are the keys' own Redis keys ("ration:{<key>}", the keys
	// layout); fields the fields of the group hashes ("ration:g{<tag>}",
	// the groups layout; an expired field counts until a write samples
	// it), in groups hashes. A key's bucket, share and escrow are one
	// entry in either layout.
	own, fields, groups int64
	// groupsHT and xgroupsHT are the group hashes and the exchange's
	// state groups that Redis keeps as hash tables rather than listpacks
	// (a field over hash-max-listpack-value bytes, or more fields than
	// hash-max-listpack-entries): several times the memory a key, for good.
	groupsHT, xgroupsHT int64
	// xkeys are the exchange's own Redis keys (its hold, its state's head
	// and the state's groups), xrecords the state's records (one a key it
	// holds state for, the head's "n") and xbytes MEMORY USAGE summed over
	// the head and every group of the state.
	xkeys, xrecords, xbytes int64
}

// entries are the keys' entries in this Redis: a key in either layout.
func (m redisMemory) entries() int64 { return m.own + m.fields }

// storePrefix is regiond's Redis key prefix (lease.RedisConfig's default),
// and exchangeKey a key of the exchange's in region reg, as
// sync/exchange.RedisCoordinator names it.
const storePrefix = "ration:"

func exchangeKey(reg, what string) string { return storePrefix + "exchange:{" + reg + "}:" + what }

// groupPattern matches the group hashes of lease's LayoutGroups,
// "<prefix>g{<tag>}[<n>]", and no key's own name, "<prefix>{<key>}".
const groupPattern = storePrefix + "g{*"

// scanBatch is SCAN's COUNT and the commands pipelined at once: a sample
// costs Redis a few thousand short calls, spread between the leases'.
const scanBatch = 1000

// readRedis counts what reg's Redis holds. It reads the exchange's head
// (records and groups), sizes every group of the state with MEMORY USAGE,
// and, for the groups layout, finds the group hashes with SCAN and sums
// their HLEN: O(groups) calls, not O(keys).
func readRedis(ctx context.Context, rc redis.UniversalClient, reg string) (redisMemory, error) {
	var m redisMemory
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
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
	if m.dbsize, err = rc.DBSize(ctx).Result(); err != nil {
		return m, fmt.Errorf("DBSIZE: %w", err)
	}
	if err := readExchange(ctx, rc, reg, &m); err != nil {
		return m, err
	}
	var group []string
	var cursor uint64
	for {
		var names []string
		names, cursor, err = rc.ScanType(ctx, cursor, groupPattern, scanBatch, "hash").Result()
		if err != nil {
			return m, fmt.Errorf("SCAN %s: %w", groupPattern, err)
		}
		group = append(group, names...)
		if cursor == 0 {
			break
		}
	}
	// SCAN may return a name twice; count each once.
	slices.Sort(group)
	group = slices.Compact(group)
	m.groups = int64(len(group))
	err = eachInPipelines(ctx, rc, group, func(p redis.Pipeliner, k string) *redis.IntCmd { return p.HLen(ctx, k) }, func(_ int, l int64, enc string) {
		m.fields += l
		if enc == "hashtable" {
			m.groupsHT++
		}
	})
	if err != nil {
		return m, fmt.Errorf("HLEN of the groups: %w", err)
	}
	m.own = max(m.dbsize-m.groups-m.xkeys, 0)
	return m, nil
}

// readExchange reads the exchange's keys in reg's Redis: its hold, its
// state's head ('\0grouped' at "", G at "g", the records at "n") and its G
// groups, "<head>:<i>", whose MEMORY USAGE it sums.
func readExchange(ctx context.Context, rc redis.UniversalClient, reg string, m *redisMemory) error {
	head := exchangeKey(reg, "state")
	n, err := rc.Exists(ctx, exchangeKey(reg, "lease"), head).Result()
	if err != nil {
		return fmt.Errorf("EXISTS: %w", err)
	}
	m.xkeys = n
	if typ, err := rc.Type(ctx, head).Result(); err != nil {
		return fmt.Errorf("TYPE %s: %w", head, err)
	} else if typ != "hash" {
		return nil // no state saved yet
	}
	meta, err := rc.HMGet(ctx, head, "", "g", "n").Result()
	if err != nil {
		return fmt.Errorf("HMGET %s: %w", head, err)
	}
	// "\x00grouped2" keeps long records apart in ":l" hashes (always hash
	// tables, holding only those records); "\x00grouped" is the layout before.
	if meta[0] != "\x00grouped2" && meta[0] != "\x00grouped" {
		return fmt.Errorf("exchange state %s: not in groups (field \"\" is %q): this tool reads the layout of sync/exchange.RedisCoordinator", head, meta[0])
	}
	gs, _ := meta[1].(string)
	ns, _ := meta[2].(string)
	g, err1 := strconv.ParseInt(gs, 10, 64)
	m.xrecords, err = strconv.ParseInt(ns, 10, 64)
	if err1 != nil || err != nil {
		return fmt.Errorf("exchange state %s: groups %q, records %q", head, gs, ns)
	}
	names := []string{head}
	for i := range g {
		names = append(names, head+":"+strconv.FormatInt(i, 10), head+":"+strconv.FormatInt(i, 10)+":l")
	}
	err = eachInPipelines(ctx, rc, names, func(p redis.Pipeliner, k string) *redis.IntCmd { return p.MemoryUsage(ctx, k) }, func(i int, size int64, enc string) {
		m.xbytes += size
		if i > 0 { // the head is in EXISTS's count
			m.xkeys++
			if enc == "hashtable" && !strings.HasSuffix(names[i], ":l") {
				m.xgroupsHT++
			}
		}
	})
	if err != nil {
		return fmt.Errorf("MEMORY USAGE of the state: %w", err)
	}
	return nil
}

// eachInPipelines asks Redis, in pipelines of scanBatch, for size (HLEN,
// MEMORY USAGE) and OBJECT ENCODING of every key of names, and calls each
// with the key's index, size and encoding for the keys that exist (a key
// deleted or expired since it was listed answers nil, and is skipped).
func eachInPipelines(ctx context.Context, rc redis.UniversalClient, names []string,
	size func(redis.Pipeliner, string) *redis.IntCmd, each func(i int, size int64, enc string)) error {
	for first := 0; first < len(names); first += scanBatch {
		chunk := names[first:min(first+scanBatch, len(names))]
		pipe := rc.Pipeline()
		sizes := make([]*redis.IntCmd, len(chunk))
		encs := make([]*redis.StringCmd, len(chunk))
		for i, k := range chunk {
			sizes[i] = size(pipe, k)
			encs[i] = pipe.ObjectEncoding(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		for i, s := range sizes {
			if s.Err() == nil && encs[i].Err() == nil {
				each(first+i, s.Val(), encs[i].Val())
			}
		}
	}
	return nil
}
