package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"
)

// pprofEnv names the variable that gives a regiond built with pprofSource
// the address of its pprof server.
const pprofEnv = "RATION_SCALE_PPROF"

// pprofSource is added to cmd/regiond by an overlay when -heap-profiles
// asks for profiles: regiond's admin server has no /debug/pprof, and the
// heap of a regiond at scale is what the profiles are for. Only the
// binary in the run's temp dir has it.
const pprofSource = `package main

import (
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	addr := os.Getenv("` + pprofEnv + `")
	if addr == "" {
		return
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ration-scale pprof:", err)
		return
	}
	go func() { _ = http.Serve(l, nil) }()
}
`

// buildRegiondPprof builds cmd/regiond into dir with pprofSource beside
// its main.go (go build -overlay), so that the module's files stay as
// they are.
func buildRegiondPprof(ctx context.Context, dir string) (string, error) {
	const pkg = "github.com/ration-dev/ration/cmd/regiond"
	out, err := exec.CommandContext(ctx, "go", "list", "-f", "{{.Dir}}", pkg).Output()
	if err != nil {
		return "", fmt.Errorf("go list %s (run from within the ration module): %w", pkg, err)
	}
	src := filepath.Join(dir, "pprof.go")
	if err := os.WriteFile(src, []byte(pprofSource), 0o644); err != nil {
		return "", err
	}
	overlay, err := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(strings.TrimSpace(string(out)), "zz_ration_scale_pprof.go"): src},
	})
	if err != nil {
		return "", err
	}
	ovPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovPath, overlay, 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "regiond")
	cmd := exec.CommandContext(ctx, "go", "build", "-overlay", ovPath, "-o", bin, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build regiond with pprof: %w\n%s", err, b)
	}
	return bin, nil
}

// writeProfiles writes each regiond's heap profile (after a GC) and this
// process's into dir: regiond-<region>.heap and harness.heap, for go tool
// pprof.
func (d *deployment) writeProfiles(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	hc := &http.Client{Timeout: 2 * time.Minute}
	for _, t := range d.targets {
		if t.daemon == nil || t.daemon.pprof == "" {
			continue
		}
		if err := fetchTo(ctx, hc, "http://"+t.daemon.pprof+"/debug/pprof/heap?gc=1", filepath.Join(dir, "regiond-"+t.name+".heap")); err != nil {
			return fmt.Errorf("regiond %s heap profile: %w", t.name, err)
		}
	}
	f, err := os.Create(filepath.Join(dir, "harness.heap"))
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func fetchTo(ctx context.Context, hc *http.Client, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
