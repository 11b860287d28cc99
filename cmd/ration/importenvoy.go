package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/policy/envoyimport"
)

var importEnvoyCmd = &command{
	name: "import-envoy", args: "FILE|DIR", minArgs: 1, maxArgs: 1,
	summary: "convert Envoy ratelimit configuration (a file, or every *.yaml and *.yml of a directory) into a policy on stdout, offline",
	run:     runImportEnvoy,
}

type importJSON struct {
	OK      bool     `json:"ok"`
	Files   []string `json:"files"`
	Rules   int      `json:"rules"`
	Version string   `json:"version"`
	Notes   []string `json:"notes,omitempty"`
	Policy  string   `json:"policy"`
}

func runImportEnvoy(c *cli, args []string) error {
	names, err := envoyFiles(args[0])
	if err != nil {
		return err
	}
	files := make([]envoyimport.File, 0, len(names))
	for _, name := range names {
		data, err := readLimited(name, policy.MaxDocumentSize)
		if err != nil {
			return err
		}
		files = append(files, envoyimport.File{Name: name, Data: data})
	}
	res, err := envoyimport.Convert(files)
	if err != nil {
		return err
	}
	src := res.Set.Source()
	c.emit(importJSON{OK: true, Files: names, Rules: len(res.Set.Rules()), Version: res.Set.Version(), Notes: res.Notes, Policy: string(src)}, func(w io.Writer) {
		for _, n := range res.Notes {
			fmt.Fprintln(c.stderr, "note:", n)
		}
		w.Write(src)
	})
	return nil
}

// envoyFiles returns path, or for a directory its *.yaml and *.yml files
// (not its subdirectories'), sorted.
func envoyFiles(path string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, usageError{err.Error()}
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, usageError{err.Error()}
	}
	var out []string
	for _, e := range entries {
		ext := strings.ToLower(filepath.Ext(e.Name()))
		if !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
			out = append(out, filepath.Join(path, e.Name()))
		}
	}
	if len(out) == 0 {
		return nil, usageError{fmt.Sprintf("%s holds no *.yaml or *.yml file", path)}
	}
	slices.Sort(out)
	return out, nil
}

// readLimited reads at most limit+1 bytes of a file (the converter refuses
// a larger one); an unreadable file is a usage error.
func readLimited(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usageError{err.Error()}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, usageError{fmt.Sprintf("reading %s: %v", path, err)}
	}
	return data, nil
}
