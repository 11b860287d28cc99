package redistest

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// UsedMemory is the used_memory of an INFO memory reply less the clients'
// buffers (mem_clients_normal): what the data costs, for tests that
// measure bytes per key. info returns the reply (a go-redis
// client.Info(ctx, "memory").Result).
func UsedMemory(t testing.TB, info func() (string, error)) int64 {
	t.Helper()
	reply, err := info()
	if err != nil {
		t.Fatal(err)
	}
	field := func(name string) int64 {
		for line := range strings.SplitSeq(reply, "\r\n") {
			if v, ok := strings.CutPrefix(line, name+":"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		t.Fatalf("no %s in INFO memory:\n%s", name, reply)
		return 0
	}
	return field("used_memory") - field("mem_clients_normal")
}

// MemoryKeys is the number of keys a memory-per-key test writes: 100,000,
// 10,000 with -short, or the integer (at least 1,000) in the environment
// variable env when it is set ("" reads none).
func MemoryKeys(t testing.TB, env string) int {
	t.Helper()
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	if v := os.Getenv(env); env != "" && v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1000 {
			t.Fatalf("%s=%q: want an integer ≥ 1000", env, v)
		}
	}
	return n
}
