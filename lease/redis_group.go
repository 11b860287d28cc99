package lease

import (
	"crypto/sha256"
	"fmt"
	"math/bits"
	"strconv"
	"sync"
)

// RedisLayout is where a RedisStore keeps a key's state (docs/DESIGN.md,
// "Redis layouts (as built)").
type RedisLayout int

const (
	// LayoutKeys keeps each key in a Redis key of its own,
	// "<prefix>{<key>}", expiring with the key's state: about 150–180 B a
	// key on Redis 7.0, most of it Redis's own per-key cost. The default.
	LayoutKeys RedisLayout = iota
	// LayoutGroups keeps each key as a field of one of RedisConfig.Groups
	// hashes, "<prefix>g{<tag>}", whose value carries the key's expiry:
	// about 70 B a key once a hash holds tens of keys.
	LayoutGroups
)

// String is the layout's name, as ParseRedisLayout reads it.
func (l RedisLayout) String() string {
	switch l {
	case LayoutKeys:
		return "keys"
	case LayoutGroups:
		return "groups"
	}
	return "RedisLayout(" + strconv.Itoa(int(l)) + ")"
}

// ParseRedisLayout reads a layout's name ("keys" or "groups"), as a flag
// gives it. The error wraps ErrInvalid.
func ParseRedisLayout(s string) (RedisLayout, error) {
	switch s {
	case "keys":
		return LayoutKeys, nil
	case "groups":
		return LayoutGroups, nil
	}
	return 0, fmt.Errorf("%w: redis layout %q: want keys or groups", ErrInvalid, s)
}

// clusterSlots is Redis Cluster's slot count. A group's hash tag is chosen
// so that the group lies in the slot of the keys it holds, which lets one
// script read and move a key between its own Redis key and its group on a
// Cluster, where a script's keys must share a slot.
const clusterSlots = 16384

// DefaultRedisGroups is RedisConfig.Groups' default: 2^17 hashes, so that
// ten million active keys make about 76 a hash, under the 128 fields up to
// which Redis keeps a hash compact (hash-max-listpack-entries).
const DefaultRedisGroups = 1 << 17

// maxRedisGroups bounds RedisConfig.Groups (2^24, 1,024 a slot).
const maxRedisGroups = 1 << 24

// validGroups reports whether n is a usable group count.
func validGroups(n int) bool {
	return n >= 1 && n <= maxRedisGroups && bits.OnesCount(uint(n)) == 1
}

// groupKey is the Redis key of the hash holding the key whose escaped form
// (keyEscaper) is esc: "<prefix>g{<tag>}", followed by the sub-group's
// number when there are more groups than slots. The tag lies in the slot
// of "<prefix>{<esc>}" when groups ≥ clusterSlots (with fewer, in the slot
// of the group's number, and only a single Redis can run the layout). The
// 'g' keeps group names apart from keys' own names, "<prefix>{…}".
func groupKey(prefix, esc string, groups int) string {
	slot := int(crc16(esc)) % clusterSlots
	if groups <= clusterSlots {
		return prefix + "g{" + slotTag(slot&(groups-1)) + "}"
	}
	// FNV-1a (hash/fnv's New32a), inline: it runs for every item of
	// every call, and the hash.Hash32 would allocate.
	h := uint32(2166136261)
	for i := 0; i < len(esc); i++ {
		h = (h ^ uint32(esc[i])) * 16777619
	}
	sub := int(h) & (groups/clusterSlots - 1)
	var num [8]byte
	return prefix + "g{" + slotTag(slot) + "}" + string(strconv.AppendInt(num[:0], int64(sub), 10))
}

// Field names. A key of up to maxFieldKey bytes is its own field; a longer
// one is its first longFieldHead bytes and a SHA-256 prefix, exactly
// maxFieldKey+1 bytes, so the two forms never meet, and a field stays
// within Redis's default hash-max-listpack-value of 64 bytes, above which
// a hash (and every key in it) is stored in a far larger form.
const (
	maxFieldKey   = 40
	longFieldHead = 17
)

// groupField is key's field in its group.
func groupField(key string) string {
	if len(key) <= maxFieldKey {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return key[:longFieldHead] + string(sum[:maxFieldKey+1-longFieldHead])
}

// groupValue is a key's field value: its expiry (ms, uint48, 0 never),
// then its state as in the key's own Redis key (redisState; the short form
// reads last from this expiry).
func groupValue(expireAtMS int64, st string) string {
	b := make([]byte, 6, 6+len(st))
	putUintN(b, uint64(expireAtMS), 6)
	return string(append(b, st...))
}

// decodeGroupValue splits a field value into its expiry (ms, 0 never) and
// state.
func decodeGroupValue(v string) (expireAtMS int64, st redisState, err error) {
	if len(v) < 6 {
		return 0, st, fmt.Errorf("lease: bad redis group value %q", v)
	}
	expireAtMS = int64(uintN([]byte(v[:6]), 6))
	if len(v) == 6+shortStateLen && expireAtMS == 0 {
		return 0, st, fmt.Errorf("lease: bad redis group value %q: a short state without an expiry", v)
	}
	st, err = decodeRedisState(v[6:], expireAtMS)
	return expireAtMS, st, err
}

// slotTag is a short alphanumeric string in Cluster slot s: the hash tag of
// the groups of the keys in s.
func slotTag(s int) string { return slotTags()[s] }

// slotTags maps each slot to the shortest alphanumeric string in it, the
// first in the order of the search (two characters, then three; every slot
// is covered by three). Built once, on first use (about a millisecond).
var slotTags = sync.OnceValue(func() *[clusterSlots]string {
	const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	var tags [clusterSlots]string
	left := clusterSlots
	var buf [4]byte
	var search func(n, at int)
	search = func(n, at int) {
		if at == n {
			s := int(crc16(string(buf[:n]))) % clusterSlots
			if tags[s] == "" {
				tags[s] = string(buf[:n])
				left--
			}
			return
		}
		for i := 0; i < len(alphabet) && left > 0; i++ {
			buf[at] = alphabet[i]
			search(n, at+1)
		}
	}
	for n := 1; n <= len(buf) && left > 0; n++ {
		search(n, 0)
	}
	if left > 0 {
		panic("lease: a cluster slot without a tag") // TestSlotTags
	}
	return &tags
})

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), the hash of Redis
// Cluster's key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
