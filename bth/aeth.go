package bth

import (
	"encoding/binary"
	"time"
)

// AETH is a view of the 4-byte ACK Extended Transport Header: a syndrome
// byte and the 24-bit MSN (count of messages the responder completed).
//
// The syndrome's bits 7:5 say what kind of acknowledgement it is and bits
// 4:0 qualify it: an ACK's credit code, an RNR NAK's timer code, or a NAK's
// error code.
type AETH []byte

// AckKind is the syndrome's type, bits 7:5.
type AckKind uint8

// Syndrome kinds (IBA Table 43). 010 is reserved.
const (
	KindACK      AckKind = 0 // 000: positive acknowledgement
	KindRNRNAK   AckKind = 1 // 001: receiver not ready
	KindReserved AckKind = 2 // 010: reserved
	KindNAK      AckKind = 3 // 011: negative acknowledgement
)

var kindNames = [8]string{"ACK", "RNR_NAK", "RESERVED", "NAK", "RESERVED", "RESERVED", "RESERVED", "RESERVED"}

// String returns ACK, RNR_NAK, NAK or RESERVED.
func (k AckKind) String() string { return kindNames[k&7] }

// NAKCode is a NAK syndrome's bits 4:0.
type NAKCode uint8

// NAK codes 0..4 (IBA Table 44).
const (
	NAKPSNSequenceError       NAKCode = 0
	NAKInvalidRequest         NAKCode = 1
	NAKRemoteAccessError      NAKCode = 2
	NAKRemoteOperationalError NAKCode = 3
	NAKInvalidRDRequest       NAKCode = 4
)

var nakNames = [5]string{"PSN_SEQUENCE_ERROR", "INVALID_REQUEST", "REMOTE_ACCESS_ERROR", "REMOTE_OPERATIONAL_ERROR", "INVALID_RD_REQUEST"}

// String names the code, or RESERVED.
func (c NAKCode) String() string {
	if int(c) < len(nakNames) {
		return nakNames[c]
	}
	return "RESERVED"
}

// CreditUnlimited is the ACK credit code meaning "no end-to-end flow
// control"; rxe always sends it (syndrome 0x1F).
const CreditUnlimited = 31

// Syndrome builders. Each masks its argument to five bits.

// ACKSyndrome is an ACK carrying credit code c (CreditUnlimited if unsure).
func ACKSyndrome(credit uint8) uint8 { return credit & 0x1F }

// RNRNAKSyndrome is an RNR NAK asking the requester to wait RNRTimeout(code).
func RNRNAKSyndrome(timerCode uint8) uint8 { return 0x20 | timerCode&0x1F }

// NAKSyndrome is a NAK with the given code.
func NAKSyndrome(code NAKCode) uint8 { return 0x60 | uint8(code)&0x1F }

// Syndrome returns the syndrome byte.
func (a AETH) Syndrome() uint8 { return a[0] }

// Kind returns the syndrome's type.
func (a AETH) Kind() AckKind { return AckKind(a[0] >> 5) }

// Code returns the syndrome's low five bits: credit code, RNR timer code or
// NAK code depending on Kind.
func (a AETH) Code() uint8 { return a[0] & 0x1F }

// CreditCode returns an ACK's credit code.
func (a AETH) CreditCode() uint8 { return a[0] & 0x1F }

// RNRTimer returns an RNR NAK's timer code (see RNRTimeout).
func (a AETH) RNRTimer() uint8 { return a[0] & 0x1F }

// NAKCode returns a NAK's code.
func (a AETH) NAKCode() NAKCode { return NAKCode(a[0] & 0x1F) }

// MSN returns the message sequence number.
func (a AETH) MSN() uint32 { return binary.BigEndian.Uint32(a) & 0xFFFFFF }

// Encode stores a syndrome and MSN.
func (a AETH) Encode(syndrome uint8, msn uint32) {
	binary.BigEndian.PutUint32(a, uint32(syndrome)<<24|msn&0xFFFFFF)
}

// EncodeACK stores an ACK with a credit code.
func (a AETH) EncodeACK(credit uint8, msn uint32) { a.Encode(ACKSyndrome(credit), msn) }

// EncodeRNRNAK stores an RNR NAK with a timer code.
func (a AETH) EncodeRNRNAK(timerCode uint8, msn uint32) { a.Encode(RNRNAKSyndrome(timerCode), msn) }

// EncodeNAK stores a NAK with its code.
func (a AETH) EncodeNAK(code NAKCode, msn uint32) { a.Encode(NAKSyndrome(code), msn) }

// rnrMicros is the RNR NAK timer table (IBA Table 45), code → µs. Code 0 is
// the longest wait, not the shortest. rxe's own table has 61410 for code 25,
// a typo for the spec's 61.44 ms.
var rnrMicros = [32]uint32{
	655360, 10, 20, 30, 40, 60, 80, 120,
	160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720,
	40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
}

// RNRTimeout returns how long an RNR NAK with timer code c asks the
// requester to wait before retrying.
func RNRTimeout(code uint8) time.Duration {
	return time.Duration(rnrMicros[code&0x1F]) * time.Microsecond
}

// RNRTimeoutMicros is RNRTimeout in microseconds, as the IBA table gives it.
func RNRTimeoutMicros(code uint8) uint32 { return rnrMicros[code&0x1F] }

// RNRTimerCode returns the code of the shortest RNR wait that is at least d
// (the QP attribute min_rnr_timer is chosen this way). Waits longer than
// 491.52 ms get code 0, the 655.36 ms maximum.
func RNRTimerCode(d time.Duration) uint8 {
	// Codes 1..31 grow monotonically; code 0 is above them all.
	for c := 1; c < 32; c++ {
		if time.Duration(rnrMicros[c])*time.Microsecond >= d {
			return uint8(c)
		}
	}
	return 0
}

// creditTable maps an ACK credit code (0..30) to the number of receive WQEs
// the responder has posted (IBA Table 46). Code 31 means "unlimited".
var creditTable = [31]uint16{
	0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192,
	256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
}

// Credits returns how many receive WQEs credit code c advertises;
// unlimited is true for code 31 (the responder does no flow control).
func Credits(code uint8) (n int, unlimited bool) {
	code &= 0x1F
	if code == CreditUnlimited {
		return 0, true
	}
	return int(creditTable[code]), false
}

// CreditCode returns the largest credit code advertising no more than n
// receive WQEs, so that the requester never overruns the receive queue.
func CreditCode(n int) uint8 {
	c := uint8(0)
	for i, v := range creditTable {
		if int(v) <= n {
			c = uint8(i)
		}
	}
	return c
}
