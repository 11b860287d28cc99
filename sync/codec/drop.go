package codec

import (
	"errors"
	"fmt"

	"github.com/ration-dev/ration/region"
)

// Reason says why a received message, part or report was dropped. The
// Exchanger counts every drop by reason (ration_exchange_dropped_total)
// and applies none.
type Reason string

// Drop reasons.
const (
	// ReasonCorrupt: not an envelope, a checksum mismatch, or a body that
	// does not parse.
	ReasonCorrupt Reason = "corrupt"
	// ReasonTruncated: the message ends inside a field.
	ReasonTruncated Reason = "truncated"
	// ReasonOversized: larger than Limits allow (bytes, parts or keys).
	ReasonOversized Reason = "oversized"
	// ReasonVersion: an envelope version this build does not read.
	ReasonVersion Reason = "version"
	// ReasonInconsistent: fields that contradict each other or Limits: a
	// part index out of range, parts of one report with different headers,
	// a key count that does not add up, an over-long name.
	ReasonInconsistent Reason = "inconsistent"
	// ReasonDuplicate: a part or report already received.
	ReasonDuplicate Reason = "duplicate"
	// ReasonReplayed: a report older than one already received from the
	// same replica.
	ReasonReplayed Reason = "replayed"
	// ReasonIncomplete: parts of a report whose other parts did not arrive
	// in time (counted per part dropped).
	ReasonIncomplete Reason = "incomplete"
	// ReasonOverflow: the receive queue or the reassembly buffer was full.
	ReasonOverflow Reason = "overflow"
	// ReasonMalformed: the report breaks region.Report's shape (rows of
	// the wrong length, negative or out-of-range counters).
	ReasonMalformed Reason = "malformed"
	// ReasonUnknownRegion: a report from a region not configured here.
	ReasonUnknownRegion Reason = "unknown_region"
	// ReasonStale: region.State had a report as new from that replica.
	ReasonStale Reason = "stale"
	// ReasonRegressed: a counter went down (the sender lost state).
	ReasonRegressed Reason = "regressed"
)

// Reasons lists every Reason, for metrics that start at zero.
var Reasons = []Reason{
	ReasonCorrupt, ReasonTruncated, ReasonOversized, ReasonVersion, ReasonInconsistent,
	ReasonDuplicate, ReasonReplayed, ReasonIncomplete, ReasonOverflow,
	ReasonMalformed, ReasonUnknownRegion, ReasonStale, ReasonRegressed,
}

// ErrDropped is wrapped by every *DropError: match with errors.Is.
var ErrDropped = errors.New("codec: message dropped")

// DropError is a message, part or report that was dropped, and why.
type DropError struct {
	Reason Reason
	Detail string
	// Err is the underlying error, if any (a region sentinel).
	Err error
}

func (e *DropError) Error() string {
	return fmt.Sprintf("codec: dropped (%s): %s", e.Reason, e.Detail)
}

// Unwrap returns ErrDropped and the underlying error.
func (e *DropError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrDropped, e.Err}
	}
	return []error{ErrDropped}
}

func drop(r Reason, format string, args ...any) error {
	return &DropError{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// ReasonOf returns the drop reason of err: a *DropError's, or the reason
// matching a region.State.Receive error. ok is false for other errors.
func ReasonOf(err error) (r Reason, ok bool) {
	var de *DropError
	switch {
	case err == nil:
		return "", false
	case errors.As(err, &de):
		return de.Reason, true
	case errors.Is(err, region.ErrMalformed):
		return ReasonMalformed, true
	case errors.Is(err, region.ErrUnknownRegion):
		return ReasonUnknownRegion, true
	case errors.Is(err, region.ErrStale):
		return ReasonStale, true
	case errors.Is(err, region.ErrRegressed):
		return ReasonRegressed, true
	}
	return "", false
}
