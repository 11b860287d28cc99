package lease

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/ration-dev/ration/region"
)

// bucketScript is the allocator contract as one Redis Lua script per key.
//
//go:embed bucket.lua
var bucketScript string

// bucketScriptSHA is the script's SHA1 digest, the name EVALSHA runs it by.
// Redis names scripts by SHA1; it is an identifier here, not a security
// measure.
var bucketScriptSHA = func() string {
	sum := sha1.Sum([]byte(bucketScript))
	return hex.EncodeToString(sum[:])
}()

// Script operations (ARGV[1]).
const (
	opGrant  = "g"
	opReturn = "r"
	opShare  = "s"
	// opDeleteShare drops a key's share; it reads no limit.
	opDeleteShare = "d"
)

// scriptItem is one call of the script: a key, its limit, the op, its
// argument (ARGV[7]) and, for a share update, the tokens received.
type scriptItem struct {
	key      string
	limit    Limit
	op       string
	n        int64
	gen      uint64
	received int64
	window   int64         // the window of received
	shareTTL time.Duration // RedisConfig.ShareTTL
	layout   RedisLayout   // RedisConfig.Layout
	maxShare int64         // GrantRequest.MaxShare
	raise    []ShareStep   // GrantRequest.Raise's or ShareUpdate.Steps's steps
}

// layoutArg is ARGV[16] for each layout.
var layoutArg = [...]string{LayoutKeys: "k", LayoutGroups: "g"}

// scriptArgs is ARGV for one call of the script.
func scriptArgs(it scriptItem) []any {
	l := it.limit
	empty := "0"
	if l.StartEmpty {
		empty = "1"
	}
	args := []any{
		it.op,
		// 'g' with precision -1 is the shortest string that parses back to
		// the same float64, which Lua's tonumber then reads exactly.
		strconv.FormatFloat(l.Rate, 'g', -1, 64),
		strconv.FormatFloat(l.Burst, 'g', -1, 64),
		strconv.FormatInt(l.Cost, 10),
		strconv.FormatInt(l.InitialShare, 10),
		empty,
		strconv.FormatInt(it.n, 10),
		strconv.FormatUint(it.gen, 10),
		strconv.FormatInt(it.received, 10),
		strconv.FormatInt(it.window, 10),
		strconv.FormatInt(l.Window[0], 10),
		strconv.FormatInt(l.Window[1], 10),
		strconv.FormatInt(l.Window[2], 10),
		strconv.FormatInt(l.Window[3], 10),
		strconv.FormatInt(shareTTLMillis(it.shareTTL), 10),
		layoutArg[it.layout],
		groupField(it.key),
		strconv.FormatInt(it.maxShare, 10),
	}
	if len(it.raise) > 0 {
		args = append(args, strconv.Itoa(len(it.raise)))
		for _, st := range it.raise {
			args = append(args, strconv.FormatInt(st.SharePPM, 10), strconv.FormatInt(st.Age.Microseconds(), 10))
		}
	}
	return args
}

// scriptReply is the script's answer: {granted, tokens, share, µs to a
// fixed window's end, the window's start}.
type scriptReply struct {
	granted  int64
	tokens   float64
	sharePPM int64
	untilEnd int64
	window   int64
	// err is an item's error (a fixed window whose boundaries do not
	// span the server's clock); the other fields are zero then.
	err error
}

// parseScriptReply decodes what go-redis made of the script's return value.
// A malformed reply (a different script under the same name, a proxy that
// mangles replies) is an error, never a panic.
func parseScriptReply(v any) (scriptReply, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) != 5 {
		return scriptReply{}, fmt.Errorf("lease: unexpected script reply %#v", v)
	}
	granted, ok1 := arr[0].(int64)
	tokensStr, ok2 := arr[1].(string)
	share, ok3 := arr[2].(int64)
	untilEnd, ok4 := arr[3].(int64)
	window, ok5 := arr[4].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return scriptReply{}, fmt.Errorf("lease: unexpected script reply %#v", v)
	}
	tokens, err := strconv.ParseFloat(tokensStr, 64)
	if err != nil {
		return scriptReply{}, fmt.Errorf("lease: unexpected tokens in script reply: %w", err)
	}
	if granted < 0 || share < 0 || share > region.PPM || tokens != tokens || untilEnd < 0 || window < 0 {
		return scriptReply{}, fmt.Errorf("lease: script reply out of range %#v", v)
	}
	return scriptReply{granted: granted, tokens: tokens, sharePPM: share, untilEnd: untilEnd, window: window}, nil
}
