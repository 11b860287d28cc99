package codec

// Limits bound what the decoder accepts, so that a hostile or broken
// message costs bounded memory and CPU. The zero value of a field means its
// default.
type Limits struct {
	// MaxMessageBytes is the largest message accepted (default 64 MiB, the
	// largest max_payload a NATS server allows). Senders split reports to
	// the connection's max_payload, which is smaller.
	MaxMessageBytes int
	// MaxParts is the most parts one report may have (default 1024).
	MaxParts int
	// MaxKeys is the most keys one report may carry (default 4,194,304).
	MaxKeys int
	// MaxNameBytes bounds region and replica names (default 256).
	MaxNameBytes int
	// MaxKeyBytes bounds a key's identity (default 4096).
	MaxKeyBytes int
	// MaxExits bounds the exit records of one key (default 64).
	MaxExits int
}

func (l Limits) withDefaults() Limits {
	if l.MaxMessageBytes <= 0 {
		l.MaxMessageBytes = 64 << 20
	}
	if l.MaxParts <= 0 {
		l.MaxParts = 1024
	}
	if l.MaxKeys <= 0 {
		l.MaxKeys = 4 << 20
	}
	if l.MaxNameBytes <= 0 {
		l.MaxNameBytes = 256
	}
	if l.MaxKeyBytes <= 0 {
		l.MaxKeyBytes = 4096
	}
	if l.MaxExits <= 0 {
		l.MaxExits = 64
	}
	return l
}

// maxRegions is region's bound on a region set.
const maxRegions = 64

// maxResend bounds a part's resend requests (region.Report.Resend): one per
// stream a receiver merges, a few per region.
const maxResend = 4 * maxRegions

// maxResendBytes bounds one resend request: a region and a replica name,
// an epoch and separators.
func maxResendBytes(lim Limits) int { return 2*lim.MaxNameBytes + 24 }
