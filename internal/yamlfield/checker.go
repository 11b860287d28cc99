package yamlfield

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// A Checker collects the problems found in one document. Its zero value
// with File set is ready to use; it is not safe for concurrent use.
type Checker[S Sentinel] struct {
	// File names the document in every problem.
	File string
	// MaxProblems is the most problems kept; past it they are only
	// counted, and Err ends with one more problem giving the count. 0
	// keeps every problem.
	MaxProblems int

	errs    Errors[S]
	dropped int // problems beyond MaxProblems
}

// Errorf records a problem at line (0: none) in field (empty: the whole
// document).
func (c *Checker[S]) Errorf(line int, field, format string, args ...any) {
	if c.MaxProblems > 0 && len(c.errs) >= c.MaxProblems {
		c.dropped++
		return
	}
	c.errs = append(c.errs, &Error[S]{File: c.File, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// Err returns nil when no problem was recorded, else the problems as an
// Errors sorted by line (problems of one line in the order recorded), then
// the count of those beyond MaxProblems, if any.
func (c *Checker[S]) Err() error {
	if len(c.errs) == 0 {
		return nil
	}
	out := slices.Clone(c.errs)
	slices.SortStableFunc(out, func(a, b *Error[S]) int { return cmp.Compare(a.Line, b.Line) })
	if c.dropped > 0 {
		out = append(out, &Error[S]{File: c.File,
			Msg: fmt.Sprintf("%d more problems not shown (at most %d are reported)", c.dropped, c.MaxProblems)})
	}
	return out
}

// Document says how Root reads a document.
type Document struct {
	// Empty is the problem recorded for a document without content.
	Empty string
	// Single makes a second document a problem unless it is empty ("---"
	// at the end of a file is common in generated YAML); without it, what
	// follows the first document is not read.
	Single bool
	// SyntaxLine moves the line of a syntax error out of its message into
	// the problem's Line. Without it the problem has no line and the
	// message keeps yaml's "line N: ".
	SyntaxLine bool
}

// Root decodes the first YAML document of data and returns its root node,
// or nil after recording why there is none: a syntax error, an empty
// document, or (with d.Single) a second document.
func (c *Checker[S]) Root(data []byte, d Document) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			c.Errorf(0, "", "%s", d.Empty)
		} else {
			c.syntaxError(err, d.SyntaxLine)
		}
		return nil
	}
	if d.Single && !c.restEmpty(dec, d.SyntaxLine) {
		return nil
	}
	if len(doc.Content) == 0 {
		c.Errorf(0, "", "%s", d.Empty)
		return nil
	}
	return doc.Content[0]
}

// restEmpty reads the documents after the first and reports whether they
// are all empty, recording a problem when one is not.
func (c *Checker[S]) restEmpty(dec *yaml.Decoder, syntaxLine bool) bool {
	for {
		var extra yaml.Node
		err := dec.Decode(&extra)
		if errors.Is(err, io.EOF) {
			return true
		}
		if err != nil {
			c.syntaxError(err, syntaxLine)
			return false
		}
		if len(extra.Content) == 0 {
			continue
		}
		if n := extra.Content[0]; n.Kind != yaml.ScalarNode || n.ShortTag() != "!!null" || n.Value != "" {
			c.Errorf(n.Line, "", "only one YAML document is allowed")
			return false
		}
	}
}

// syntaxError records a YAML parser error. yaml.v3 reports syntax errors as
// text ("yaml: line 3: did not find expected key"), so with withLine the
// line is read back out of it; a message without one gets line 0. The line
// is yaml.v3's: where the construct around the problem began, which can be
// a line or so before the problem itself.
func (c *Checker[S]) syntaxError(err error, withLine bool) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok && withLine {
		if n, tail, ok := strings.Cut(rest, ": "); ok {
			if l, err := strconv.Atoi(n); err == nil {
				line, msg = l, tail
			}
		}
	}
	c.Errorf(line, "", "YAML syntax error: %s", msg)
}
