package lease

import (
	"encoding/binary"
	"fmt"
	"math"
)

// redisState is the value of a key's one Redis key, as bucket.lua writes
// it: a binary string, little endian, the smallest of the encodings
// measured (TestRedisMemoryPerKey). The short form, exactly 12 bytes, is
// tokens (float64) and d (uint32), the µs from the bucket's last update to
// the key's expiry, which Redis keeps anyway (last = PEXPIRETIME × 1000 −
// d). The long form is a flags byte, tokens (float64), last (µs, 7 bytes),
// then as flagged: the fixed window's start (7 bytes); the share (ppm, 3
// bytes) and the bucket's expiry (ms, 6 bytes, 0 never); the escrow's
// generation and credited tokens (7 bytes each); the escrow's window (7
// bytes).
type redisState struct {
	tokens float64
	last   int64 // µs
	win    int64 // a fixed window's start, µs; 0 none

	hasShare     bool
	share        int64
	bucketExpire int64 // ms; 0 never
	gen          uint64
	credited     int64
	window       int64 // the escrow's window, µs
}

// Long form flags.
const (
	stateWindow = 1 << iota
	stateShare
	stateEscrow
	stateEscrowWindow
)

// shortStateLen is the length of the short form.
const shortStateLen = 12

// decodeRedisState reads v, the value of a key whose expiry is expireAtMS
// (PEXPIRETIME; the short form needs it for last).
func decodeRedisState(v string, expireAtMS int64) (redisState, error) {
	b := []byte(v)
	if len(b) == shortStateLen {
		return redisState{
			tokens: math.Float64frombits(binary.LittleEndian.Uint64(b)),
			last:   expireAtMS*1000 - int64(binary.LittleEndian.Uint32(b[8:])),
		}, nil
	}
	if len(b) < 16 || b[0] > 15 || len(b) != stateLen(b[0]) {
		return redisState{}, fmt.Errorf("lease: bad redis state %q", v)
	}
	f := b[0]
	st := redisState{tokens: math.Float64frombits(binary.LittleEndian.Uint64(b[1:])), last: int64(uintN(b[9:], 7))}
	b = b[16:]
	next := func(n int) uint64 {
		x := uintN(b, n)
		b = b[n:]
		return x
	}
	if f&stateWindow != 0 {
		st.win = int64(next(7))
	}
	if f&stateShare != 0 {
		st.hasShare, st.share, st.bucketExpire = true, int64(next(3)), int64(next(6))
	}
	if f&stateEscrow != 0 {
		st.gen, st.credited = next(7), int64(next(7))
	}
	if f&stateEscrowWindow != 0 {
		st.window = int64(next(7))
	}
	if st.share > 1_000_000 {
		return redisState{}, fmt.Errorf("lease: bad redis state: share %d", st.share)
	}
	return st, nil
}

// encode is st's long form.
func (st redisState) encode() string {
	var f byte
	b := make([]byte, 16, 52)
	binary.LittleEndian.PutUint64(b[1:], math.Float64bits(st.tokens))
	putUintN(b[9:], uint64(st.last), 7)
	if st.win != 0 {
		f |= stateWindow
		b = appendUintN(b, uint64(st.win), 7)
	}
	if st.hasShare {
		f |= stateShare
		b = appendUintN(b, uint64(st.share), 3)
		b = appendUintN(b, uint64(st.bucketExpire), 6)
		if st.gen > 0 {
			f |= stateEscrow
			b = appendUintN(b, st.gen, 7)
			b = appendUintN(b, uint64(st.credited), 7)
			if st.window != 0 {
				f |= stateEscrowWindow
				b = appendUintN(b, uint64(st.window), 7)
			}
		}
	}
	b[0] = f
	return string(b)
}

// stateLen is the long form's length for flags f.
func stateLen(f byte) int {
	n := 16
	for _, p := range []struct {
		bit  byte
		size int
	}{{stateWindow, 7}, {stateShare, 9}, {stateEscrow, 14}, {stateEscrowWindow, 7}} {
		if f&p.bit != 0 {
			n += p.size
		}
	}
	return n
}

func uintN(b []byte, n int) uint64 {
	var x uint64
	for i := n - 1; i >= 0; i-- {
		x = x<<8 | uint64(b[i])
	}
	return x
}

func putUintN(b []byte, x uint64, n int) {
	for i := range n {
		b[i] = byte(x >> (8 * i))
	}
}

func appendUintN(b []byte, x uint64, n int) []byte {
	for i := range n {
		b = append(b, byte(x>>(8*i)))
	}
	return b
}
