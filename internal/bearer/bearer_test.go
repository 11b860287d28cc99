package bearer

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestGuard(t *testing.T) {
	checkEvery = 0
	t.Cleanup(func() { checkEvery = time.Second })
	path := filepath.Join(t.TempDir(), "token")
	write := func(s string) {
		if err := os.WriteFile(path+".tmp", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write("  s3cret-token-of-enough-bytes\n")
	g, err := New(path)
	if err != nil {
		t.Fatal(err)
	}
	h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("metrics")) }))
	code := func(auth string) int {
		r := httptest.NewRequest("GET", "/metrics", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for auth, want := range map[string]int{
		"":                                     401,
		"Bearer wrong":                         401,
		"Basic czNjcmV0LXRva2Vu":               401,
		"Bearer s3cret-token-of-enough-bytes":  200,
		"Bearer s3cret-token-of-enough-bytes ": 401,
	} {
		if got := code(auth); got != want {
			t.Errorf("Authorization %q: got %d, want %d", auth, got, want)
		}
	}
	// A rotated token is in force at once; the old one no longer is.
	write("a-new-token-after-rotation")
	if code("Bearer a-new-token-after-rotation") != 200 || code("Bearer s3cret-token-of-enough-bytes") != 401 {
		t.Error("the rotated token is not in force")
	}
	// A file rewritten too short keeps the token in force.
	write("short")
	if code("Bearer a-new-token-after-rotation") != 200 {
		t.Error("a bad rewrite dropped the token in force")
	}
	for _, bad := range []string{"short", ""} {
		write(bad)
		if _, err := New(path); !errors.Is(err, ErrToken) {
			t.Errorf("token %q: got %v, want ErrToken", bad, err)
		}
	}
	if _, err := New(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, ErrToken) {
		t.Errorf("a missing file: got %v, want ErrToken", err)
	}
}
