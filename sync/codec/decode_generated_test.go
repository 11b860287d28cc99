package codec

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ration-dev/ration/region"
	syncv1 "github.com/ration-dev/ration/sync/v1"
)

// The codec as it was before the hand-written one, through the generated
// code: the reference that the tests and FuzzDecodeDifferential compare
// EncodeReport and DecodePart with, and the baseline of the benchmarks.

// encodeReportGenerated is EncodeReportVersion(…, V1) through proto.Marshal.
func encodeReportGenerated(r *region.Report, id uint64, maxBytes int) ([][]byte, error) {
	hdr := &syncv1.Part{
		Region:         r.Region,
		Replica:        r.Replica,
		Epoch:          r.Epoch,
		SentAtUnixNano: unixNano(r.SentAt),
		Exchange:       r.Exchange,
		Regions:        r.Regions,
		Refresh:        r.Refresh,
		RefreshFrom:    r.RefreshFrom,
		RefreshCount:   r.RefreshCount,
		Since:          r.Since,
		Prev:           r.Prev,
		Resent:         r.Resent,
		Resend:         r.Resend,
		Policy:         r.Policy,
		Rules:          rulesToPB(r.Rules),
		Reads:          uint32(Latest),
		ReportId:       id,
		Part:           ^uint32(0), // the largest varints, for sizing
		Parts:          ^uint32(0),
		KeysTotal:      ^uint32(0),
	}
	budget := maxBytes - envelopeOverhead - proto.Size(hdr)
	if budget <= 0 {
		return nil, fmt.Errorf("%w: a %d-byte message cannot hold the report header", ErrTooLarge, maxBytes)
	}
	if uint64(len(r.Keys)) > uint64(^uint32(0)) {
		return nil, fmt.Errorf("%w: %d keys", ErrTooLarge, len(r.Keys))
	}
	keys := make([]syncv1.Key, len(r.Keys))
	ptrs := make([]*syncv1.Key, len(r.Keys))
	var cuts []int // index of the first key of each part after the first
	used := 0
	for i := range r.Keys {
		keyToPB(&keys[i], &r.Keys[i])
		ptrs[i] = &keys[i]
		n := proto.Size(&keys[i])
		n += 1 + protowire.SizeVarint(uint64(n)) // tag and length in Part
		if n > budget {
			return nil, fmt.Errorf("%w: key %q needs %d bytes, %d available", ErrTooLarge, r.Keys[i].Key, n, budget)
		}
		if used+n > budget {
			cuts = append(cuts, i)
			used = 0
		}
		used += n
	}
	parts := len(cuts) + 1
	hdr.Parts, hdr.KeysTotal = uint32(parts), uint32(len(r.Keys))
	out := make([][]byte, 0, parts)
	start := 0
	for p := 0; p < parts; p++ {
		end := len(r.Keys)
		if p < len(cuts) {
			end = cuts[p]
		}
		hdr.Part, hdr.Keys = uint32(p), ptrs[start:end]
		body, err := proto.Marshal(hdr)
		if err != nil {
			return nil, fmt.Errorf("codec: encoding part %d: %w", p, err)
		}
		out = append(out, appendEnvelope(make([]byte, 0, len(body)+envelopeOverhead), body))
		start = end
	}
	return out, nil
}

// keyToPB sets pk, a zero Key, to k.
func keyToPB(pk *syncv1.Key, k *region.KeyReport) {
	*pk = syncv1.Key{
		Key:        k.Key,
		Generation: k.Generation,
		Base:       k.Base,
		Row:        k.Row,
		Taken:      k.Taken,
		In:         k.In,
		InTaken:    k.InTaken,
		SharePpm:   k.SharePPM,
		Demand:     k.Demand,
		Granted:    k.Granted,
		Settled:    k.Settled,
		Tokens:     k.Tokens,

		TokensWindow: k.TokensWindow,
	}
	for _, x := range k.Exits {
		pk.Exits = append(pk.Exits, &syncv1.Exit{
			Generation: x.Generation, Row: x.Row, Taken: x.Taken, In: x.In, InTaken: x.InTaken,
		})
	}
}

// decodePartGenerated is DecodePart through proto.Unmarshal.
func decodePartGenerated(msg []byte, lim Limits) (*Part, error) {
	lim = lim.withDefaults()
	if len(msg) > lim.MaxMessageBytes {
		return nil, drop(ReasonOversized, "%d bytes, more than %d", len(msg), lim.MaxMessageBytes)
	}
	body, v, err := openEnvelopeVersion(msg)
	if err != nil {
		return nil, err
	}
	var pb syncv1.Part
	if err := proto.Unmarshal(body, &pb); err != nil {
		return nil, drop(ReasonCorrupt, "part: %v", err)
	}
	var keys []region.KeyReport
	if v >= V2 {
		if len(pb.Keys) > 0 {
			return nil, drop(ReasonInconsistent, "a version %d part with version 1 keys", v)
		}
		if err := checkPB(&pb, lim, len(pb.KeyFlags)); err != nil {
			return nil, err
		}
		if keys, err = columnsFromPB(&pb, lim, v); err != nil {
			return nil, err
		}
	} else if err := checkPB(&pb, lim, len(pb.Keys)); err != nil {
		return nil, err
	}
	p := &Part{
		Header: region.Report{
			Region:   pb.Region,
			Replica:  pb.Replica,
			Epoch:    pb.Epoch,
			SentAt:   fromUnixNano(pb.SentAtUnixNano),
			Exchange: pb.Exchange,
			Refresh:  pb.Refresh, RefreshFrom: pb.RefreshFrom, RefreshCount: pb.RefreshCount, Since: pb.Since,
			Prev: pb.Prev, Resent: pb.Resent, Resend: pb.Resend,
			Regions: pb.Regions,
			Policy:  pb.Policy,
			Rules:   rulesFromPB(pb.Rules),
		},
		ID:        pb.ReportId,
		Index:     int(pb.Part),
		Count:     int(pb.Parts),
		KeysTotal: int(pb.KeysTotal),
		Size:      len(msg),
		Version:   v,
		Reads:     max(V1, Version(pb.Reads)),
		Keys:      keys,
	}
	if v == V1 && len(pb.Keys) > 0 {
		p.Keys = make([]region.KeyReport, len(pb.Keys))
	}
	for i, k := range pb.Keys {
		p.Keys[i] = keyFromPB(k)
	}
	return p, nil
}

// checkPB is DecodePart's checks of a decoded part against lim.
// keys is the part's number of keys: Key messages (V1) or flags (V2, V3).
func checkPB(pb *syncv1.Part, lim Limits, keys int) error {
	bad := func(format string, args ...any) error { return drop(ReasonInconsistent, format, args...) }
	switch {
	case pb.Region == "" || len(pb.Region) > lim.MaxNameBytes:
		return bad("region name of %d bytes", len(pb.Region))
	case pb.Replica == "" || len(pb.Replica) > lim.MaxNameBytes:
		return bad("replica name of %d bytes", len(pb.Replica))
	case pb.Parts == 0 || pb.Part >= pb.Parts:
		return bad("part %d of %d", pb.Part, pb.Parts)
	case int64(pb.Parts) > int64(lim.MaxParts):
		return drop(ReasonOversized, "%d parts, more than %d", pb.Parts, lim.MaxParts)
	case int64(pb.KeysTotal) > int64(lim.MaxKeys):
		return drop(ReasonOversized, "%d keys, more than %d", pb.KeysTotal, lim.MaxKeys)
	case keys > int(pb.KeysTotal):
		return bad("part holds %d keys of a report of %d", keys, pb.KeysTotal)
	case len(pb.Regions) > maxRegions:
		return bad("%d regions, more than %d", len(pb.Regions), maxRegions)
	}
	for _, r := range pb.Regions {
		if len(r) > lim.MaxNameBytes {
			return bad("region name of %d bytes", len(r))
		}
	}
	if len(pb.Resend) > maxResend {
		return bad("%d resend requests, more than %d", len(pb.Resend), maxResend)
	}
	for _, r := range pb.Resend {
		if len(r) > maxResendBytes(lim) {
			return bad("resend request of %d bytes", len(r))
		}
	}
	if len(pb.Policy) > lim.MaxNameBytes {
		return bad("policy name of %d bytes", len(pb.Policy))
	}
	if len(pb.Rules) > maxRules {
		return bad("%d rule definitions, more than %d", len(pb.Rules), maxRules)
	}
	for _, d := range pb.Rules {
		if len(d.Name) > lim.MaxNameBytes {
			return bad("rule name of %d bytes", len(d.Name))
		}
	}
	for i, k := range pb.Keys {
		if len(k.Key) > lim.MaxKeyBytes {
			return bad("key %d: %d bytes, more than %d", i, len(k.Key), lim.MaxKeyBytes)
		}
		if len(k.Exits) > lim.MaxExits {
			return bad("key %q: %d exit records, more than %d", k.Key, len(k.Exits), lim.MaxExits)
		}
	}
	return nil
}

func keyFromPB(k *syncv1.Key) region.KeyReport {
	kr := region.KeyReport{
		Key:        k.Key,
		Generation: k.Generation,
		Base:       k.Base,
		Row:        k.Row,
		Taken:      k.Taken,
		In:         k.In,
		InTaken:    k.InTaken,
		SharePPM:   k.SharePpm,
		Demand:     k.Demand,
		Granted:    k.Granted,
		Settled:    k.Settled,
		Tokens:     k.Tokens,

		TokensWindow: k.TokensWindow,
	}
	if len(k.Exits) > 0 {
		kr.Exits = make([]region.Exit, len(k.Exits))
		for j, x := range k.Exits {
			if x == nil {
				continue
			}
			kr.Exits[j] = region.Exit{Generation: x.Generation, Row: x.Row, Taken: x.Taken, In: x.In, InTaken: x.InTaken}
		}
	}
	return kr
}

// encodeSnapshotGenerated is EncodeSnapshot through proto.Marshal.
func encodeSnapshotGenerated(s *region.Snapshot) ([]byte, error) {
	pb := &syncv1.Snapshot{
		Region:          s.Region,
		Regions:         s.Regions,
		Epoch:           s.Epoch,
		GenerationFloor: s.GenerationFloor,
		Heard:           s.Heard,
		HeardAtUnixNano: make([]int64, len(s.HeardAt)),
		Keys:            make([]*syncv1.KeySnapshot, len(s.Keys)),
	}
	for i, t := range s.HeardAt {
		pb.HeardAtUnixNano[i] = unixNano(t)
	}
	keys := make([]syncv1.KeySnapshot, len(s.Keys))
	for i := range s.Keys {
		k := &s.Keys[i]
		keys[i] = syncv1.KeySnapshot{
			Key: k.Key, Generation: k.Generation, GenerationFloor: k.GenerationFloor, Base: k.Base,
			Row: k.Row, Taken: k.Taken, In: k.In, InTaken: k.InTaken,
			Refund: k.Refund, Unclaim: k.Unclaim, Demand: k.Demand,
			Ack: k.Ack, AckTaken: k.AckTaken, Settled: k.Settled,
			Tokens: k.Tokens, TokensIn: k.TokensIn, TokensWindow: k.TokensWindow, TokensInWindow: k.TokensInWindow,
		}
		for _, x := range k.Exits {
			keys[i].Exits = append(keys[i].Exits, &syncv1.ExitSnapshot{
				Exit:       &syncv1.Exit{Generation: x.Generation, Row: x.Row, Taken: x.Taken, In: x.In, InTaken: x.InTaken},
				Refund:     x.Refund,
				Ack:        x.Ack,
				Dropped:    x.Dropped,
				AtUnixNano: unixNano(x.At),
			})
		}
		pb.Keys[i] = &keys[i]
	}
	body, err := proto.Marshal(pb)
	if err != nil {
		return nil, fmt.Errorf("codec: encoding snapshot: %w", err)
	}
	return appendEnvelope(make([]byte, 0, len(body)+envelopeOverhead), body), nil
}

func rulesToPB(defs []region.RuleDef) []*syncv1.RuleDef {
	var out []*syncv1.RuleDef
	for _, d := range defs {
		out = append(out, &syncv1.RuleDef{Name: d.Name, Fingerprint: d.Fingerprint, FixedWindow: d.FixedWindow,
			Limit: d.Limit, PeriodNs: int64(d.Period), Burst: d.Burst, Cost: d.Cost})
	}
	return out
}

func rulesFromPB(defs []*syncv1.RuleDef) []region.RuleDef {
	var out []region.RuleDef
	for _, d := range defs {
		out = append(out, region.RuleDef{Name: d.Name, Fingerprint: d.Fingerprint, FixedWindow: d.FixedWindow,
			Limit: d.Limit, Period: time.Duration(d.PeriodNs), Burst: d.Burst, Cost: d.Cost})
	}
	return out
}
