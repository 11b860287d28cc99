package leasev1

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestDemandCounted checks that the mark is found through wrapping, and
// only on an error that carries it.
func TestDemandCounted(t *testing.T) {
	marked := DemandCountedError(codes.Unavailable, "region store: timed out")
	for _, c := range []struct {
		err  error
		want bool
	}{
		{marked, true},
		{fmt.Errorf("agent: %w", marked), true},
		{nil, false},
		{errors.New("timed out"), false},
		{status.Error(codes.Unavailable, "region store: timed out"), false},
	} {
		if got := DemandCounted(c.err); got != c.want {
			t.Errorf("DemandCounted(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if status.Code(marked) != codes.Unavailable {
		t.Errorf("code %v, want Unavailable", status.Code(marked))
	}
}
