package bth

// PSN is a 24-bit packet sequence number. All PSN arithmetic in softrnic
// lives here: sequence numbers wrap modulo 2^24, so comparing them as plain
// integers is wrong near the wrap point, and the transports must never do it.
//
// Comparison follows the IBA rule (and rxe's psn_compare): p is "before" q
// when the signed 24-bit distance p-q is negative, which is only meaningful
// when the two are less than 2^23 apart. Windows far smaller than that (rxe
// keeps at most 128 PSNs unacknowledged) make it safe.
type PSN uint32

// PSNMask keeps the 24 bits that a PSN has on the wire.
const PSNMask = 0xFFFFFF

// PSNHalf is 2^23, the distance beyond which PSN order is undefined.
const PSNHalf = 1 << 23

// Add returns p+n modulo 2^24.
func (p PSN) Add(n uint32) PSN { return PSN((uint32(p) + n) & PSNMask) }

// Sub returns p-n modulo 2^24.
func (p PSN) Sub(n uint32) PSN { return PSN((uint32(p) - n) & PSNMask) }

// Next returns the PSN after p.
func (p PSN) Next() PSN { return PSN((uint32(p) + 1) & PSNMask) }

// Prev returns the PSN before p.
func (p PSN) Prev() PSN { return PSN((uint32(p) - 1) & PSNMask) }

// Diff returns the signed distance p-q in [-2^23, 2^23): positive when p is
// after q. Shifting the 24-bit difference into the top of an int32 and back
// sign-extends it, which is the whole trick.
func (p PSN) Diff(q PSN) int32 { return int32((uint32(p)-uint32(q))<<8) >> 8 }

// Less reports whether p comes strictly before q.
func (p PSN) Less(q PSN) bool { return p.Diff(q) < 0 }

// LessEq reports whether p comes before q or equals it.
func (p PSN) LessEq(q PSN) bool { return p.Diff(q) <= 0 }

// InWindow reports whether p is one of the n PSNs start, start+1, …,
// start+n-1 (modulo 2^24). n ≥ 2^24 covers every PSN.
func (p PSN) InWindow(start PSN, n uint32) bool {
	return (uint32(p)-uint32(start))&PSNMask < n
}

// Valid reports whether p fits in 24 bits, as every PSN read from the wire
// does; a PSN built from arithmetic here always does too.
func (p PSN) Valid() bool { return uint32(p) <= PSNMask }
