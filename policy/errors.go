package policy

import (
	"errors"

	"github.com/ration-dev/ration/internal/yamlfield"
)

// ErrInvalid is wrapped by every validation error Parse returns:
// errors.Is(err, policy.ErrInvalid) tells a bad document from an I/O error.
var ErrInvalid = errors.New("policy: invalid")

// FieldError is one problem in a policy document. File is the name given
// to Parse; Line is the 1-based line of the problem, 0 when it has none (an
// empty document); Field is the path of the field, like "rules[2].period",
// empty for a problem with the whole document; Msg says what is wrong, like
// "must be > 0".
//
// Error renders "rules.yaml:14: rules[2].period: must be > 0". Unwrap
// returns ErrInvalid, so a single FieldError is also an ErrInvalid.
type FieldError = yamlfield.Error[invalid]

// Errors is every problem Parse found in a document, in document order. It
// is never empty when returned. errors.Is(err, ErrInvalid) holds, and
// errors.As(err, &fe) with fe a *FieldError finds the first problem.
// Error joins the problems one per line; Is reports ErrInvalid even for an
// empty list, which Parse never returns but a caller might build.
type Errors = yamlfield.Errors[invalid]

// invalid makes FieldError and Errors wrap ErrInvalid.
type invalid struct{}

func (invalid) Sentinel() error { return ErrInvalid }
