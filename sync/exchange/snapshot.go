package exchange

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ration-dev/ration/region"
	syncv1 "github.com/ration-dev/ration/sync/v1"
)

// EncodeSnapshot encodes a region's exchange state for its store, in the
// same checksummed envelope as the reports.
func EncodeSnapshot(s *region.Snapshot) ([]byte, error) {
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
		return nil, fmt.Errorf("exchange: encoding snapshot: %w", err)
	}
	return appendEnvelope(make([]byte, 0, len(body)+envelopeOverhead), body), nil
}

// DecodeSnapshot decodes what EncodeSnapshot wrote. A damaged blob is a
// *DropError; region.State.Restore validates the content.
func DecodeSnapshot(b []byte) (region.Snapshot, error) {
	body, err := openEnvelope(b)
	if err != nil {
		return region.Snapshot{}, err
	}
	var pb syncv1.Snapshot
	if err := proto.Unmarshal(body, &pb); err != nil {
		return region.Snapshot{}, drop(ReasonCorrupt, "snapshot: %v", err)
	}
	s := region.Snapshot{
		Region:          pb.Region,
		Regions:         pb.Regions,
		Epoch:           pb.Epoch,
		GenerationFloor: pb.GenerationFloor,
		Heard:           pb.Heard,
		Keys:            make([]region.KeySnapshot, len(pb.Keys)),
	}
	s.HeardAt = make([]time.Time, len(pb.HeardAtUnixNano))
	for i, ns := range pb.HeardAtUnixNano {
		s.HeardAt[i] = fromUnixNano(ns)
	}
	for i, k := range pb.Keys {
		ks := region.KeySnapshot{
			Key: k.Key, Generation: k.Generation, GenerationFloor: k.GenerationFloor, Base: k.Base,
			Row: k.Row, Taken: k.Taken, In: k.In, InTaken: k.InTaken,
			Refund: k.Refund, Unclaim: k.Unclaim, Demand: k.Demand,
			Ack: k.Ack, AckTaken: k.AckTaken, Settled: k.Settled,
		}
		for _, x := range k.Exits {
			e := x.GetExit()
			ks.Exits = append(ks.Exits, region.ExitSnapshot{
				Exit:    region.Exit{Generation: e.GetGeneration(), Row: e.GetRow(), Taken: e.GetTaken(), In: e.GetIn(), InTaken: e.GetInTaken()},
				Refund:  x.Refund,
				Ack:     x.Ack,
				Dropped: x.Dropped,
				At:      fromUnixNano(x.AtUnixNano),
			})
		}
		s.Keys[i] = ks
	}
	return s, nil
}
