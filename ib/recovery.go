package ib

import (
	"fmt"
	"strconv"
)

// Recovery is how an RC QP recovers lost packets: a device setting and a
// per-QP one (verbs.QPInitAttr.Recovery), as ConnectX has adaptive
// retransmission and selective repeat per device and per QP. Whatever the
// mode, the local ACK timeout and retry_cnt decide when the requester
// gives up (RETRY_EXC_ERR) exactly as the IBA and rxe define them; the
// modes differ in how soon, and what, the requester retransmits before
// that. transport/rc's package documentation has the details.
type Recovery uint8

const (
	// RecoveryDefault is the device's mode for a QP, and for a device
	// RecoverySelective.
	RecoveryDefault Recovery = iota
	// RecoverySelective is adaptive retransmission toward any peer, as
	// ConnectX has it on by default, plus selective repeat toward a
	// softrnic QP number whose responder agrees; with any other peer it is
	// RecoveryAdaptive.
	RecoverySelective
	// RecoveryAdaptive is go-back-N driven by the measured RTT: tail-loss
	// probes, an RTO of a few RTTs and fast retransmission from a probe's
	// answer, besides the peer's sequence NAKs. Every peer sees only IBA
	// packets, and one that only paused costs one packet per expiry.
	RecoveryAdaptive
	// RecoveryTimeout retransmits only on a sequence NAK, a READ response
	// gap or the local ACK timeout: rxe's behaviour.
	RecoveryTimeout
)

var recoveryNames = [...]string{"default", "selective", "adaptive", "timeout"}

func (m Recovery) String() string {
	if int(m) < len(recoveryNames) {
		return recoveryNames[m]
	}
	return "Recovery(" + strconv.Itoa(int(m)) + ")"
}

// Valid reports whether m is one of the modes above.
func (m Recovery) Valid() bool { return m <= RecoveryTimeout }

// Or is m, or def when m is RecoveryDefault.
func (m Recovery) Or(def Recovery) Recovery {
	if m == RecoveryDefault {
		return def
	}
	return m
}

// ParseRecovery reads a mode by name (selective, adaptive, timeout or
// default), as the tools' --recovery flag and the daemon's recovery key
// give it.
func ParseRecovery(s string) (Recovery, error) {
	for i, n := range recoveryNames {
		if s == n {
			return Recovery(i), nil
		}
	}
	return 0, fmt.Errorf("recovery %q: want selective, adaptive, timeout or default", s)
}
