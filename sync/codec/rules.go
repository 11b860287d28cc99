package codec

import (
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/region"
)

// The header's policy and rule definitions (Part fields 19 and 20,
// region.Report.Policy and Rules): small, and repeated in every part like
// the rest of the header.

// Field numbers of RuleDef.
const (
	fRuleName        = 1
	fRuleFingerprint = 2
	fRuleFixedWindow = 3
	fRuleLimit       = 4
	fRulePeriod      = 5
	fRuleBurst       = 6
	fRuleCost        = 7
)

// maxRules bounds a part's rule definitions (region's own bound).
const maxRules = 4096

func ruleSize(d *region.RuleDef) int {
	n := stringSize(d.Name) + varintSize(uint64(d.Limit)) + varintSize(uint64(d.Period)) +
		varintSize(uint64(d.Burst)) + varintSize(uint64(d.Cost))
	if d.Fingerprint != 0 {
		n += 1 + 8
	}
	if d.FixedWindow {
		n += 2
	}
	return n
}

// rulesSize is the size of the policy and rules fields (two-byte tags).
func rulesSize(r *region.Report) int {
	n := 0
	if r.Policy != "" {
		n += 2 + protowire.SizeBytes(len(r.Policy))
	}
	for i := range r.Rules {
		n += 2 + protowire.SizeBytes(ruleSize(&r.Rules[i]))
	}
	return n
}

func appendRules(b []byte, r *region.Report) []byte {
	b = appendString(b, fPartPolicy, r.Policy)
	for i := range r.Rules {
		d := &r.Rules[i]
		b = protowire.AppendTag(b, fPartRules, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(ruleSize(d)))
		b = appendString(b, fRuleName, d.Name)
		if d.Fingerprint != 0 {
			b = protowire.AppendTag(b, fRuleFingerprint, protowire.Fixed64Type)
			b = protowire.AppendFixed64(b, d.Fingerprint)
		}
		if d.FixedWindow {
			b = appendVarint(b, fRuleFixedWindow, 1)
		}
		b = appendVarint(b, fRuleLimit, uint64(d.Limit))
		b = appendVarint(b, fRulePeriod, uint64(d.Period))
		b = appendVarint(b, fRuleBurst, uint64(d.Burst))
		b = appendVarint(b, fRuleCost, uint64(d.Cost))
	}
	return b
}

// decodeRule decodes a RuleDef message as proto.Unmarshal does (the last
// occurrence of a scalar wins, unknown fields are skipped); false for
// invalid wire data. name aliases b.
func decodeRule(b []byte, d *region.RuleDef) (name []byte, ok bool) {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		var v uint64
		switch {
		case num == fRuleName && typ == protowire.BytesType:
			name, n = consumeString(b)
		case num == fRuleFingerprint && typ == protowire.Fixed64Type:
			d.Fingerprint, n = protowire.ConsumeFixed64(b)
		case typ == protowire.VarintType && num >= fRuleFixedWindow && num <= fRuleCost:
			if v, n = protowire.ConsumeVarint(b); n >= 0 {
				switch num {
				case fRuleFixedWindow:
					d.FixedWindow = v != 0
				case fRuleLimit:
					d.Limit = int64(v)
				case fRulePeriod:
					d.Period = time.Duration(v)
				case fRuleBurst:
					d.Burst = int64(v)
				case fRuleCost:
					d.Cost = int64(v)
				}
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return nil, false
		}
		b = b[n:]
	}
	return name, true
}
