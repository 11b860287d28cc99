package redistest

import (
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
