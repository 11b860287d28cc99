// Package bearer guards HTTP endpoints with a bearer token read from a
// file, read again when the file changes, so that a rotated token (a
// Kubernetes Secret's new value, say) is in force without a restart.
package bearer

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// ErrToken is wrapped by New's error for a token file that cannot be used.
var ErrToken = errors.New("bearer: invalid token file")

// checkEvery is how often a request looks at the file's modification time.
var checkEvery = time.Second

// Guard checks requests' Authorization headers against the token in a file.
type Guard struct {
	path string

	mu      sync.Mutex
	token   []byte
	stamp   string
	checked time.Time
}

// New reads the token in path (surrounding white space trimmed; at least 16
// bytes, so that a guessable token is refused).
func New(path string) (*Guard, error) {
	g := &Guard{path: path}
	tok, stamp, err := read(path)
	if err != nil {
		return nil, err
	}
	g.token, g.stamp, g.checked = tok, stamp, time.Now()
	return g, nil
}

func read(path string) ([]byte, string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrToken, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrToken, err)
	}
	tok := []byte(strings.TrimSpace(string(b)))
	if len(tok) < 16 {
		return nil, "", fmt.Errorf("%w: %s holds %d bytes of token, want at least 16", ErrToken, path, len(tok))
	}
	return tok, fmt.Sprint(fi.ModTime().UnixNano(), fi.Size()), nil
}

// current returns the token in force, reading the file again when it changed.
func (g *Guard) current() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now := time.Now(); now.Sub(g.checked) >= checkEvery {
		g.checked = now
		if fi, err := os.Stat(g.path); err == nil && fmt.Sprint(fi.ModTime().UnixNano(), fi.Size()) != g.stamp {
			if tok, stamp, err := read(g.path); err == nil {
				g.token, g.stamp = tok, stamp
			}
		}
	}
	return g.token
}

// Allows reports whether r carries "Authorization: Bearer <token>".
func (g *Guard) Allows(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), g.current()) == 1
}

// Wrap serves h to requests that carry the token and answers the others
// 401 with a WWW-Authenticate challenge. A nil Guard serves everyone.
func (g *Guard) Wrap(h http.Handler) http.Handler {
	if g == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.Allows(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ration"`)
			http.Error(w, "unauthorized: send Authorization: Bearer <the admin token>", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
