package leasev1

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the domain of the ErrorInfo details the lease service adds
// to its errors.
const ErrorDomain = "ration.dev"

// ReasonDemandCounted is the ErrorInfo reason of a failed Lease call whose
// items' demand the region counted for its exchange all the same (its store
// failed, not the call): the agent does not report that demand again.
const ReasonDemandCounted = "DEMAND_COUNTED"

// DemandCountedError returns a failed Lease call's error with code c and
// msg, marked ReasonDemandCounted.
func DemandCountedError(c codes.Code, msg string) error {
	st := status.New(c, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonDemandCounted, Domain: ErrorDomain}); err == nil {
		st = d
	}
	return st.Err()
}

// DemandCounted reports whether err, a failed Lease call's, says that the
// region counted the demand of its items (ReasonDemandCounted).
func DemandCounted(err error) bool {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain && info.GetReason() == ReasonDemandCounted {
			return true
		}
	}
	return false
}
