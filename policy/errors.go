package policy

import (
	"errors"
	"strconv"
	"strings"
)

// ErrInvalid is wrapped by every validation error Parse returns:
// errors.Is(err, policy.ErrInvalid) tells a bad document from an I/O error.
var ErrInvalid = errors.New("policy: invalid")

// FieldError is one problem in a policy document.
type FieldError struct {
	// File is the name given to Parse.
	File string
	// Line is the 1-based line of the problem; 0 when it has none (an empty
	// document).
	Line int
	// Field is the path of the field, like "rules[2].period"; empty for a
	// problem with the whole document.
	Field string
	// Msg says what is wrong, like "must be > 0".
	Msg string
}

// Error renders "rules.yaml:14: rules[2].period: must be > 0".
func (e *FieldError) Error() string {
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

// Unwrap returns ErrInvalid, so a single FieldError is also an ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// Errors is every problem Parse found in a document, in document order. It
// is never empty when returned. errors.Is(err, ErrInvalid) holds, and
// errors.As(err, &fe) with fe a *FieldError finds the first problem.
type Errors []*FieldError

// Error joins the problems one per line.
func (es Errors) Error() string {
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
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// Is reports ErrInvalid even for an empty list, which Parse never returns
// but a caller might build.
func (es Errors) Is(target error) bool { return target == ErrInvalid }
