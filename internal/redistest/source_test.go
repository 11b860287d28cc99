package redistest

import (
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"testing"
)

// TestChooseOrder: RATION_REDIS_URL, then a local redis-server, then a
// container when a Docker engine answers, else nothing.
func TestChooseOrder(t *testing.T) {
	for _, tc := range []struct {
		name          string
		url           string
		local, docker bool
		want          source
	}{
		{"env over everything", "redis://10.0.0.1:6379", true, true, sourceEnv},
		{"env without a local server", "redis://10.0.0.1:6379", false, false, sourceEnv},
		{"local over docker", "", true, true, sourceLocal},
		{"local only", "", true, false, sourceLocal},
		{"docker only", "", false, true, sourceContainer},
		{"nothing", "", false, false, sourceNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked := false
			got := choose(probes{
				env: func(k string) string {
					if k != EnvURL {
						t.Errorf("asked for %s, want %s", k, EnvURL)
					}
					return tc.url
				},
				lookPath: func(bin string) (string, error) {
					if bin != "redis-server" {
						t.Errorf("looked for %s, want redis-server", bin)
					}
					if tc.local {
						return "/usr/bin/redis-server", nil
					}
					return "", errors.New("not found")
				},
				docker: func() bool { asked = true; return tc.docker },
			})
			if got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			// The engine is probed only when nothing before it is there.
			if wantAsked := tc.url == "" && !tc.local; asked != wantAsked {
				t.Errorf("docker probed %v, want %v", asked, wantAsked)
			}
		})
	}
}

// TestDockerReachable dials what DOCKER_HOST names: a listening unix
// socket or TCP address is reachable; a missing one, an unknown scheme or
// a bad URL is not.
func TestDockerReachable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	closed := freePort(t)
	for host, want := range map[string]bool{
		"unix://" + sock:                          true,
		"tcp://" + tl.Addr().String():             true,
		"unix://" + sock + ".missing":             false,
		"tcp://127.0.0.1:" + strconv.Itoa(closed): false,
		"ssh://user@127.0.0.1":                    false,
		"%zz":                                     false,
	} {
		env := func(k string) string {
			if k == "DOCKER_HOST" {
				return host
			}
			return ""
		}
		if got := dockerReachable(env); got != want {
			t.Errorf("DOCKER_HOST=%s: reachable %v, want %v", host, got, want)
		}
	}
}
