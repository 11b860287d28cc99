package region

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// This file holds how a receiver that missed a delta gets it again: every
// delta report names the previous one of its stream (Report.Prev), a
// receiver that did not get it asks, in its own reports, for what changed
// since (Report.Resend), and the sender lists every key whose entry changed
// since then in its next report of that kind (Report.Resent). Refreshes
// still repair what this misses, in Config.Refresh epochs.

// maxResend bounds Report.Resend: one request per stream a receiver merges.
const maxResend = 4 * maxRegions

// goneKeep is how many epochs a dropped key is remembered for resends: a
// request from longer ago is answered with every key.
const goneKeep = 64

// ResendRequest asks a replica to list again what changed in one of its
// streams since an epoch.
type ResendRequest struct {
	Region, Replica string
	Exchange        bool   // its exchange reports, else its tally reports
	From            uint64 // the first epoch missed
}

// String is the request as Report.Resend carries it: kind, epoch, region
// and replica, separated by '/' ("x/1700000000/eu/eu-0"); the replica may
// contain '/'.
func (q ResendRequest) String() string {
	kind := "t"
	if q.Exchange {
		kind = "x"
	}
	return kind + "/" + strconv.FormatUint(q.From, 10) + "/" + q.Region + "/" + q.Replica
}

// errResend reports a malformed Report.Resend entry.
var errResend = errors.New("resend request")

// ParseResendRequest is the inverse of String.
func ParseResendRequest(s string) (ResendRequest, error) {
	parts := strings.SplitN(s, "/", 4)
	if len(parts) != 4 || (parts[0] != "t" && parts[0] != "x") || parts[2] == "" || parts[3] == "" {
		return ResendRequest{}, fmt.Errorf("%w %q: want kind/epoch/region/replica", errResend, s)
	}
	from, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil || from == 0 {
		return ResendRequest{}, fmt.Errorf("%w %q: epoch %q", errResend, s, parts[1])
	}
	return ResendRequest{Region: parts[2], Replica: parts[3], Exchange: parts[0] == "x", From: from}, nil
}

// missed notes, for the report r just accepted from replica slot, whether a
// report of its stream was missed, and whether r answers a request.
func (s *State) missed(r *Report, slot int) {
	if r.Refresh == 0 {
		return
	}
	rep := &s.replicas[slot]
	w := &rep.want[0]
	last := &rep.streamTally
	if r.Exchange {
		w, last = &rep.want[1], &rep.streamExch
	}
	switch {
	case r.Since != last.since:
		// A new stream: its first report lists everything; after that
		// one was missed, ask for everything since it.
		*w = 0
		if r.Epoch != r.Since {
			*w = r.Since
		}
	case r.Prev > last.epoch:
		from := last.epoch + 1
		if *w == 0 || from < *w {
			*w = from
		}
	}
	if *w != 0 && r.Resent != 0 && r.Resent <= *w {
		*w = 0
	}
	last.since, last.epoch = r.Since, r.Epoch
}

// resendRequests returns the requests our next report carries.
func (s *State) resendRequests() []string {
	var out []string
	for i := range s.replicas {
		rep := &s.replicas[i]
		if !rep.live {
			continue
		}
		for kind, from := range rep.want {
			if from != 0 && len(out) < maxResend {
				out = append(out, ResendRequest{Region: s.cfg.Regions[rep.region], Replica: rep.name, Exchange: kind == 1, From: from}.String())
			}
		}
	}
	return out
}

// lateRequests adds to a tally report's requests those for the exchange
// reports of the epoch before that have not come: a peer region's exchange
// report of an epoch arrives a fraction of a period after it is made, well
// before our next tally report, and one that has not is most likely lost
// (or was never made: its answer then lists nothing). Asked for at once, it
// is listed again in the sender's next exchange report, as soon as the
// receiver's acknowledgement would have come (ackDue); waiting for that
// report's Prev to tell us would cost an epoch more.
func (s *State) lateRequests(out []string) []string {
	for i := range s.replicas {
		rep := &s.replicas[i]
		k, pos := rep.region, rep.streamExch
		if !rep.live || k == s.self || pos.since == 0 || rep.want[1] != 0 || rep.lastExch != s.exchEpoch[k] ||
			!s.heard(s.now, k) || pos.epoch+1 >= s.epoch || len(out) >= maxResend {
			continue
		}
		out = append(out, ResendRequest{Region: s.cfg.Regions[k], Replica: rep.name, Exchange: true, From: pos.epoch + 1}.String())
	}
	return out
}

// asked takes the requests in r that name this replica.
func (s *State) asked(r *Report) {
	for _, q := range r.Resend {
		req, err := ParseResendRequest(q)
		if err != nil || req.Region != s.cfg.Self || req.Replica != s.cfg.Replica {
			continue
		}
		from := &s.delta.resendTally
		if req.Exchange {
			from = &s.delta.resendReport
		}
		if *from == 0 || req.From < *from {
			*from = req.From
		}
	}
}

// resendFrom returns the epoch from which the next report of the kind lists
// every change (0: none asked), and whether that is more than the dropped
// keys remembered cover (then the report lists every key).
func (s *State) resendFrom(exchange bool) (from uint64, all bool) {
	from = s.delta.resendTally
	if exchange {
		from = s.delta.resendReport
	}
	return from, from != 0 && s.epoch > goneKeep && from < s.epoch-goneKeep
}
