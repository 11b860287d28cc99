package agent

import (
	"fmt"
	"testing"
	"unsafe"
)

// TestKeyStateLayout checks what keyState's comment promises: the fields a
// decision reads and the slots' expiries on line 0, the slots' words
// starting line 1 and the id, which a lookup reads, on it too, and a size
// of three whole cache lines, which Go allocates on cache-line boundaries
// (checked on a few allocations).
func TestKeyStateLayout(t *testing.T) {
	var k keyState
	words := unsafe.Offsetof(k.slots) + unsafe.Offsetof(k.slots.word)
	if words != cacheLine {
		t.Errorf("the slots' words start at %d, want %d", words, cacheLine)
	}
	if end := unsafe.Offsetof(k.slots) + unsafe.Offsetof(k.slots.exp) + unsafe.Sizeof(k.slots.exp); end > cacheLine {
		t.Errorf("the slots' expiries end at %d, beyond line 0", end)
	}
	if off := unsafe.Offsetof(k.idp); off < cacheLine || off+unsafe.Sizeof(k.idp) > 2*cacheLine {
		t.Errorf("the id is at %d, not on line 1", off)
	}
	if size := unsafe.Sizeof(k); size != 3*cacheLine {
		t.Errorf("keyState is %d bytes, want 3 cache lines", size)
	}
	km := newKeyMap() // on the heap, as the agent's are
	for i := range 100 {
		k := km.getOrCreate(fmt.Appendf(nil, "r\x00k%d", i), func(id []byte) *keyState { return newKeyState(id, 1, 0) })
		if p := uintptr(unsafe.Pointer(k)); p%cacheLine != 0 {
			t.Fatalf("a keyState allocated at %#x, not on a cache line", p)
		}
	}
}
