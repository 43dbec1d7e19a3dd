package frame

import "errors"

// Reason says why Parse rejected a frame.
type Reason uint8

// Reasons. The first group means "not RoCEv2 at all" (another protocol,
// another UDP port): a receiver passes such frames on or ignores them. The
// rest mean "RoCEv2, but malformed": counted and dropped.
const (
	ReasonNone Reason = iota

	// Not RoCEv2.
	ReasonEtherType // neither IPv4 nor IPv6 (after at most one 802.1Q tag)
	ReasonNotUDP    // IP payload is not UDP (IPv6 extension headers included)
	ReasonPort      // UDP destination port is not 4791

	// Malformed RoCEv2 (or malformed IP/UDP carrying it).
	ReasonTruncated // the frame ends before a header or the ICRC
	ReasonIPVersion // the IP version nibble disagrees with the EtherType
	ReasonIPOptions // IPv4 header with options (rxe does not accept them)
	ReasonIPLength  // IP length field smaller than its headers or beyond the frame
	ReasonFragment  // IPv4 fragment: RoCEv2 is sent with DF and never fragmented
	ReasonUDPLength // UDP length disagrees with the IP length
	ReasonTVer      // BTH transport version is not 0
	ReasonOpcode    // unknown or unsupported opcode (RD, XRC, vendor, reserved)
	ReasonHeaderLen // shorter than the opcode's extended headers plus ICRC
	ReasonPadCount  // PadCnt larger than the payload
	ReasonPayload   // payload on an opcode that carries none

	numReasons
)

var reasonText = [numReasons]string{
	ReasonNone:      "no error",
	ReasonEtherType: "not IPv4 or IPv6",
	ReasonNotUDP:    "not UDP",
	ReasonPort:      "UDP destination port is not 4791",
	ReasonTruncated: "frame truncated",
	ReasonIPVersion: "IP version disagrees with EtherType",
	ReasonIPOptions: "IPv4 options not supported",
	ReasonIPLength:  "IP length inconsistent with frame",
	ReasonFragment:  "IPv4 fragment",
	ReasonUDPLength: "UDP length inconsistent with IP length",
	ReasonTVer:      "BTH TVer is not 0",
	ReasonOpcode:    "unknown BTH opcode",
	ReasonHeaderLen: "packet shorter than the opcode's headers and ICRC",
	ReasonPadCount:  "BTH PadCnt beyond payload",
	ReasonPayload:   "payload on an opcode without payload",
}

// String describes the reason.
func (r Reason) String() string {
	if r < numReasons {
		return reasonText[r]
	}
	return "unknown reason"
}

// NotRoCE reports whether the frame is simply not RoCEv2 (as opposed to
// malformed RoCEv2).
func (r Reason) NotRoCE() bool { return r >= ReasonEtherType && r <= ReasonPort }

// ParseError is the error Parse returns. Parse returns one preallocated
// *ParseError per Reason, so rejecting a frame allocates nothing; compare
// with errors.Is against the Err… values, or take the Reason with
// errors.As.
type ParseError struct {
	Reason Reason
}

func (e *ParseError) Error() string { return "frame: " + e.Reason.String() }

// Is makes any *ParseError with the same Reason match.
func (e *ParseError) Is(target error) bool {
	t, ok := target.(*ParseError)
	return ok && t.Reason == e.Reason
}

var parseErrors = func() (a [numReasons]ParseError) {
	for i := range a {
		a[i].Reason = Reason(i)
	}
	return a
}()

func fail(r Reason) error { return &parseErrors[r] }

// Sentinel errors, one per Reason.
var (
	ErrEtherType = fail(ReasonEtherType)
	ErrNotUDP    = fail(ReasonNotUDP)
	ErrPort      = fail(ReasonPort)
	ErrTruncated = fail(ReasonTruncated)
	ErrIPVersion = fail(ReasonIPVersion)
	ErrIPOptions = fail(ReasonIPOptions)
	ErrIPLength  = fail(ReasonIPLength)
	ErrFragment  = fail(ReasonFragment)
	ErrUDPLength = fail(ReasonUDPLength)
	ErrTVer      = fail(ReasonTVer)
	ErrOpcode    = fail(ReasonOpcode)
	ErrHeaderLen = fail(ReasonHeaderLen)
	ErrPadCount  = fail(ReasonPadCount)
	ErrPayload   = fail(ReasonPayload)
)

// ReasonOf returns the Reason of an error from Parse, ReasonNone for nil or
// a foreign error.
func ReasonOf(err error) Reason {
	var e *ParseError
	if errors.As(err, &e) {
		return e.Reason
	}
	return ReasonNone
}

// IsNotRoCE reports whether err says the frame is not RoCEv2 at all.
func IsNotRoCE(err error) bool { return ReasonOf(err).NotRoCE() }
