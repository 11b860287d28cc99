package deploy

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// commands are the binaries that scripts/build builds and the image holds.
var commands = []string{"regiond", "agent", "ration"}

// goBuild is a go build command line, as far as the binaries depend on it.
type goBuild struct {
	// Env holds the variables set on the command line, but GOOS and GOARCH
	// (the target, chosen by the caller of scripts/build).
	Env      map[string]string
	Flags    map[string]string // -flag or -flag=value by name, but -o
	Packages []string
}

// valueFlags are go build's flags that take a value.
var valueFlags = map[string]bool{"o": true, "ldflags": true, "gcflags": true, "asmflags": true, "tags": true, "mod": true,
	"p": true, "pgo": true, "buildmode": true, "installsuffix": true, "toolexec": true, "overlay": true, "modfile": true, "C": true}

var envAssignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// parseGoBuild reads the go build command among a shell command's words
// (after assignments and "env"); ok is false when there is none.
func parseGoBuild(words []string) (b goBuild, ok bool, err error) {
	b = goBuild{Env: map[string]string{}, Flags: map[string]string{}}
	i := 0
	for ; i < len(words) && (envAssignment.MatchString(words[i]) || words[i] == "env"); i++ {
		if k, v, found := strings.Cut(words[i], "="); found && k != "GOOS" && k != "GOARCH" {
			b.Env[k] = v
		}
	}
	if len(words) < i+2 || words[i] != "go" || words[i+1] != "build" {
		return b, false, nil
	}
	for i += 2; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "-") {
			b.Packages = append(b.Packages, w)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
		if valueFlags[name] && !hasValue {
			if i+1 == len(words) {
				return b, true, fmt.Errorf("go build flag -%s has no value", name)
			}
			i++
			value = words[i]
		}
		if name != "o" {
			b.Flags[name] = value
		}
	}
	slices.Sort(b.Packages)
	return b, true, nil
}

// shellWords splits a shell command into words: blanks separate them,
// single and double quotes group, a backslash escapes the next character.
// Enough for the lines this test reads; it does not expand anything.
func shellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words, inWord = append(words, w.String()), false
				w.Reset()
			}
		case c == '\'' || c == '"':
			end := strings.IndexByte(s[i+1:], c)
			if end < 0 {
				return nil, fmt.Errorf("unterminated %c in %q", c, s)
			}
			w.WriteString(s[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			inWord = true
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// simpleCommands splits a shell line into its commands (at &&, || and ;).
func simpleCommands(line string) []string {
	return regexp.MustCompile(`&&|\|\||;`).Split(line, -1)
}

// goBuilds returns the go build commands of shell lines, with where each is.
func goBuilds(t *testing.T, where string, lines []string) []goBuild {
	t.Helper()
	var builds []goBuild
	for _, line := range lines {
		for _, c := range simpleCommands(line) {
			words, err := shellWords(strings.TrimSpace(c))
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			b, ok, err := parseGoBuild(words)
			if err != nil {
				t.Fatalf("%s: %q: %v", where, c, err)
			}
			if ok {
				builds = append(builds, b)
			}
		}
	}
	return builds
}

// scriptBuild returns the one go build of scripts/build.
func scriptBuild(t *testing.T) goBuild {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "scripts", "build"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			lines = append(lines, l)
		}
	}
	builds := goBuilds(t, "scripts/build", lines)
	if len(builds) != 1 {
		t.Fatalf("scripts/build: got %d go build commands, want 1", len(builds))
	}
	s := builds[0]
	// What the image and the deployment rely on.
	if s.Env["CGO_ENABLED"] != "0" {
		t.Errorf("scripts/build: got CGO_ENABLED=%q, want 0 (static binaries for a base without libc)", s.Env["CGO_ENABLED"])
	}
	if _, ok := s.Flags["trimpath"]; !ok {
		t.Errorf("scripts/build: no -trimpath")
	}
	want := []string{"./cmd/agent", "./cmd/ration", "./cmd/regiond"}
	if diff := cmp.Diff(want, s.Packages); diff != "" {
		t.Errorf("scripts/build: packages (-want +got):\n%s", diff)
	}
	return s
}

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line      int
	cmd, args string
}

func readDockerfile(t *testing.T) []instruction {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ins []instruction
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		if t := strings.TrimSpace(l); t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if s, ok := strings.CutSuffix(l, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(l)
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		ins = append(ins, instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return ins
}

// TestBuildCommandsAgree checks that the Dockerfile builds the binaries
// with scripts/build's command (running the script, or a go build with the
// same environment, flags and packages), that deploy/README.md documents
// that same command, and the image's shape: a Go builder of go.mod's
// version, a minimal final stage holding the three binaries, a non-root user.
func TestBuildCommandsAgree(t *testing.T) {
	script := scriptBuild(t)
	ins := readDockerfile(t)

	runsScript, builds := false, 0
	var stages []instruction
	for _, in := range ins {
		switch in.cmd {
		case "FROM":
			stages = append(stages, in)
		case "RUN":
			for _, c := range simpleCommands(in.args) {
				words, err := shellWords(strings.TrimSpace(c))
				if err != nil {
					t.Fatalf("Dockerfile:%d: %v", in.line, err)
				}
				for len(words) > 0 && envAssignment.MatchString(words[0]) {
					words = words[1:]
				}
				if len(words) > 0 && (words[0] == "scripts/build" || words[0] == "./scripts/build") {
					runsScript = true
				}
			}
			for _, b := range goBuilds(t, fmt.Sprintf("Dockerfile:%d", in.line), []string{in.args}) {
				builds++
				if diff := cmp.Diff(script, b); diff != "" {
					t.Errorf("Dockerfile:%d: go build differs from scripts/build's (-script +Dockerfile):\n%s", in.line, diff)
				}
			}
		}
	}
	if !runsScript && builds == 0 {
		t.Errorf("Dockerfile: no RUN runs scripts/build or go build")
	}

	// deploy/README.md documents the command for builds without Docker.
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, l := range strings.Split(string(readme), "\n") {
		if strings.Contains(l, "go build") {
			documented = append(documented, strings.Trim(strings.TrimSpace(l), "`"))
		}
	}
	docBuilds := goBuilds(t, "deploy/README.md", documented)
	if len(docBuilds) == 0 {
		t.Errorf("deploy/README.md documents no go build command")
	}
	for _, b := range docBuilds {
		if diff := cmp.Diff(script, b); diff != "" {
			t.Errorf("deploy/README.md: go build differs from scripts/build's (-script +README):\n%s", diff)
		}
	}

	if len(stages) < 2 {
		t.Fatalf("Dockerfile: got %d stages, want a build stage and a final one", len(stages))
	}
	goMod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(goMod)
	builder := regexp.MustCompile(`(?:^|\s)golang:(\d+\.\d+)[.\s-]`).FindStringSubmatch(stages[0].args + " ")
	if goVersion == nil || builder == nil || builder[1] != string(goVersion[1]) {
		t.Errorf("Dockerfile:%d: got build stage %q, want golang:%s (go.mod's go)", stages[0].line, stages[0].args, goVersion[1])
	}
	final := stages[len(stages)-1]
	if !strings.HasPrefix(final.args, "gcr.io/distroless/static") && final.args != "scratch" {
		t.Errorf("Dockerfile:%d: got final base %q, want distroless static or scratch", final.line, final.args)
	}
	user, copied := "", map[string]bool{}
	for _, in := range ins {
		if in.line < final.line {
			continue
		}
		switch in.cmd {
		case "USER":
			user = in.args
		case "COPY":
			for _, w := range strings.Fields(in.args) {
				copied[filepath.Base(w)] = true
			}
		}
	}
	if uid, _, _ := strings.Cut(user, ":"); uid == "" || uid == "0" || uid == "root" {
		t.Errorf("Dockerfile: final stage runs as %q, want a non-root user", user)
	}
	for _, c := range commands {
		if !copied[c] {
			t.Errorf("Dockerfile: final stage copies no %s", c)
		}
	}
}

// TestGoBuildParsing checks the reading of build commands on the forms
// they may take.
func TestGoBuildParsing(t *testing.T) {
	want := goBuild{Env: map[string]string{"CGO_ENABLED": "0"}, Flags: map[string]string{"trimpath": "", "ldflags": "-s -w"},
		Packages: []string{"./cmd/a", "./cmd/b"}}
	for _, line := range []string{
		`CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out/" ./cmd/a ./cmd/b`,
		`GOOS=$TARGETOS CGO_ENABLED=0 go build -o /out/ -trimpath -ldflags "-s -w" ./cmd/b ./cmd/a`,
		`cd /src && env CGO_ENABLED=0 go build --trimpath --ldflags=-s\ -w ./cmd/a ./cmd/b; ls`,
	} {
		got := goBuilds(t, "test", []string{line})
		if len(got) != 1 {
			t.Errorf("%s: got %d builds, want 1", line, len(got))
			continue
		}
		if diff := cmp.Diff(want, got[0]); diff != "" {
			t.Errorf("%s (-want +got):\n%s", line, diff)
		}
	}
}

// TestBuildScript runs scripts/build and checks the binaries: static (no
// interpreter, no dynamic section: they run on a base without libc) and
// answering -h. It builds three binaries, so -short skips it.
func TestBuildScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries; skipped with -short")
	}
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot, "scripts", "build"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/build %s: %v\n%s", out, err, b)
	}
	for _, c := range commands {
		path := filepath.Join(out, c)
		f, err := elf.Open(path)
		if err != nil {
			t.Errorf("%s: %v", c, err)
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s: got a %v program header, want a static binary", c, p.Type)
			}
		}
		for _, s := range []string{".interp", ".dynamic"} {
			if f.Section(s) != nil {
				t.Errorf("%s: got a %s section, want a static binary", c, s)
			}
		}
		f.Close()

		hctx, hcancel := context.WithTimeout(context.Background(), time.Minute)
		b, err := exec.CommandContext(hctx, path, "-h").CombinedOutput()
		hcancel()
		if err != nil {
			t.Errorf("%s -h: %v\n%s", c, err, b)
		} else if !strings.Contains(strings.ToLower(string(b)), "usage") {
			t.Errorf("%s -h: got %q, want its usage", c, b)
		}
	}
}
