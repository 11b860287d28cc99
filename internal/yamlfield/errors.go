package yamlfield

import (
	"strconv"
	"strings"
)

// Sentinel is a caller's zero-size marker type whose Sentinel method
// returns the error every Error and Errors of that caller wraps.
type Sentinel interface {
	Sentinel() error
}

// Error is one problem in a document: "file:line: field: msg".
type Error[S Sentinel] struct {
	// File names the document.
	File string
	// Line is the 1-based line of the problem; 0 when it has none.
	Line int
	// Field is the path of the field, like "rules[2].period"; empty for a
	// problem with the whole document.
	Field string
	// Msg says what is wrong, like "must be > 0".
	Msg string
}

// Error renders "rules.yaml:14: rules[2].period: must be > 0", leaving out
// the line when it is 0 and the field when it is empty.
func (e *Error[S]) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns S's sentinel, so a single Error is also one.
func (e *Error[S]) Unwrap() error {
	var s S
	return s.Sentinel()
}

// Errors is every problem found in a document, sorted by line.
type Errors[S Sentinel] []*Error[S]

// Error joins the problems one per line.
func (es Errors[S]) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap returns the problems, for errors.Is and errors.As.
func (es Errors[S]) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// Is reports S's sentinel even for an empty list, which a Checker never
// returns but a caller might build.
func (es Errors[S]) Is(target error) bool {
	var s S
	return target == s.Sentinel()
}
