package checker

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
)

// Packet is a transport packet decoded for assertions.
type Packet struct {
	Op      bth.Opcode
	PSN     bth.PSN
	DestQP  uint32
	AckReq  bool
	SR      bool // softrnic's selective-repeat bit
	BECN    bool
	HasAETH bool
	Syn     uint8  // the AETH's syndrome, if HasAETH
	MSN     uint32 // the AETH's MSN, if HasAETH
	Payload []byte // after the headers, without the pad
	Raw     []byte // the whole packet
}

// Decode decodes b, a transport packet: the BTH and what follows it, up to
// the ICRC. It copies b, so the Packet outlives the buffer. A packet too
// short for its opcode's headers decodes with no payload.
func Decode(b []byte) Packet {
	raw := append([]byte(nil), b...)
	if len(raw) < bth.BTHLen {
		return Packet{Raw: raw}
	}
	h := bth.BTH(raw)
	op := h.Opcode()
	p := Packet{Op: op, PSN: h.PSN(), DestQP: h.DestQP(), AckReq: h.AckReq(), SR: h.SR(), BECN: h.BECN(), Raw: raw}
	if o := op.Offset(bth.ExtAETH); o >= 0 && o+bth.AETHLen <= len(raw) {
		a := bth.AETH(raw[o:])
		p.Syn, p.MSN, p.HasAETH = a.Syndrome(), a.MSN(), true
	}
	if hl, end := op.HeaderLen(), len(raw)-h.PadCount(); hl <= end {
		p.Payload = raw[hl:end]
	}
	return p
}

func (p Packet) String() string {
	s := fmt.Sprintf("%v psn=%d", p.Op, p.PSN)
	if p.HasAETH {
		s += fmt.Sprintf(" syn=%#x msn=%d", p.Syn, p.MSN)
	}
	if p.AckReq {
		s += " A"
	}
	return s + fmt.Sprintf(" len=%d", len(p.Payload))
}

// A Check is one property a packet must have: it returns what differs.
type Check func(p *Packet) error

// Opcode checks the BTH's opcode.
func Opcode(op bth.Opcode) Check {
	return func(p *Packet) error {
		if p.Op != op {
			return fmt.Errorf("opcode %v, want %v", p.Op, op)
		}
		return nil
	}
}

// PSN checks the BTH's PSN.
func PSN(psn bth.PSN) Check {
	return func(p *Packet) error {
		if p.PSN != psn {
			return fmt.Errorf("PSN %d, want %d", p.PSN, psn)
		}
		return nil
	}
}

// DestQP checks the BTH's destination QP.
func DestQP(qpn uint32) Check {
	return func(p *Packet) error {
		if p.DestQP != qpn {
			return fmt.Errorf("DestQP %#x, want %#x", p.DestQP, qpn)
		}
		return nil
	}
}

// AckReq checks the BTH's AckReq bit.
func AckReq(on bool) Check {
	return func(p *Packet) error {
		if p.AckReq != on {
			return fmt.Errorf("AckReq %v, want %v", p.AckReq, on)
		}
		return nil
	}
}

// SR checks softrnic's selective-repeat bit.
func SR(on bool) Check {
	return func(p *Packet) error {
		if p.SR != on {
			return fmt.Errorf("SR %v, want %v", p.SR, on)
		}
		return nil
	}
}

// BECN checks the BTH's BECN bit (a CNP's).
func BECN(on bool) Check {
	return func(p *Packet) error {
		if p.BECN != on {
			return fmt.Errorf("BECN %v, want %v", p.BECN, on)
		}
		return nil
	}
}

// AETH checks that the packet has an AETH with this syndrome and MSN.
func AETH(syn uint8, msn uint32) Check {
	return func(p *Packet) error {
		switch {
		case !p.HasAETH:
			return errors.New("no AETH")
		case p.Syn != syn || p.MSN != msn:
			return fmt.Errorf("AETH syndrome %#x MSN %d, want %#x %d", p.Syn, p.MSN, syn, msn)
		}
		return nil
	}
}

// Syndrome checks the AETH's syndrome alone.
func Syndrome(syn uint8) Check {
	return func(p *Packet) error {
		if !p.HasAETH || p.Syn != syn {
			return fmt.Errorf("AETH syndrome %#x (AETH %v), want %#x", p.Syn, p.HasAETH, syn)
		}
		return nil
	}
}

// Payload checks the payload byte for byte.
func Payload(want []byte) Check {
	return func(p *Packet) error {
		if !bytes.Equal(p.Payload, want) {
			return fmt.Errorf("payload of %d bytes differs from the %d expected", len(p.Payload), len(want))
		}
		return nil
	}
}

// PayloadLen checks the payload's length.
func PayloadLen(n int) Check {
	return func(p *Packet) error {
		if len(p.Payload) != n {
			return fmt.Errorf("payload of %d bytes, want %d", len(p.Payload), n)
		}
		return nil
	}
}

// Orig checks an ATOMIC ACKNOWLEDGE's original remote value.
func Orig(v uint64) Check {
	return func(p *Packet) error {
		o := p.Op.Offset(bth.ExtAtomicAckETH)
		if o < 0 || o+bth.AtomicAckETHLen > len(p.Raw) {
			return fmt.Errorf("%v has no AtomicAckETH", p.Op)
		}
		if got := bth.AtomicAckETH(p.Raw[o:]).Orig(); got != v {
			return fmt.Errorf("original value %#x, want %#x", got, v)
		}
		return nil
	}
}

// Want is what one packet must be: every Check passes.
type Want []Check

// Is is the Want of checks.
func Is(checks ...Check) Want { return checks }

func (w Want) check(p *Packet) error {
	var errs []string
	for _, c := range w {
		if err := c(p); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// Transport decodes b, a transport packet, fails t unless every check
// passes, and returns the packet.
func Transport(t testing.TB, b []byte, checks ...Check) Packet {
	t.Helper()
	p := Decode(b)
	if err := Want(checks).check(&p); err != nil {
		t.Fatalf("packet %v: %v", p, err)
	}
	return p
}

// Packets fails t unless got holds exactly as many packets as want and
// got[i] passes want[i]; the message shows every packet.
func Packets(t testing.TB, got []Packet, want ...Want) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d packets %v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if err := want[i].check(&got[i]); err != nil {
			t.Fatalf("packet %d %v: %v (all: %v)", i, got[i], err, got)
		}
	}
}

// A FrameCheck is one property an Ethernet frame must have.
type FrameCheck func(f *frame.Frame) error

// Src checks the IP source address.
func Src(a netip.Addr) FrameCheck {
	return func(f *frame.Frame) error {
		if f.Src() != a {
			return fmt.Errorf("source %v, want %v", f.Src(), a)
		}
		return nil
	}
}

// Dst checks the IP destination address.
func Dst(a netip.Addr) FrameCheck {
	return func(f *frame.Frame) error {
		if f.Dst() != a {
			return fmt.Errorf("destination %v, want %v", f.Dst(), a)
		}
		return nil
	}
}

// ECN checks the IP header's ECN field.
func ECN(ecn uint8) FrameCheck {
	return func(f *frame.Frame) error {
		if f.ECN() != ecn {
			return fmt.Errorf("ECN %d, want %d", f.ECN(), ecn)
		}
		return nil
	}
}

// TrafficClass checks the IPv4 TOS or the IPv6 traffic class, ECN
// included.
func TrafficClass(tc uint8) FrameCheck {
	return func(f *frame.Frame) error {
		var got uint8
		if f.IsIPv6() {
			got = f.IPv6().TrafficClass()
		} else {
			got = f.IPv4().TOS()
		}
		if got != tc {
			return fmt.Errorf("traffic class %#x, want %#x", got, tc)
		}
		return nil
	}
}

// UDPSrcPort checks the UDP source port (the QP's flow entropy).
func UDPSrcPort(port uint16) FrameCheck {
	return func(f *frame.Frame) error {
		if got := f.UDP().SrcPort(); got != port {
			return fmt.Errorf("UDP source port %d, want %d", got, port)
		}
		return nil
	}
}

// TransportIs applies transport Checks to the frame's transport packet.
func TransportIs(checks ...Check) FrameCheck {
	return func(f *frame.Frame) error {
		p := Decode(TransportOf(f))
		if err := Want(checks).check(&p); err != nil {
			return fmt.Errorf("%v: %w", p, err)
		}
		return nil
	}
}

// TransportOf is a parsed frame's transport packet: the BTH and what
// follows it, up to the ICRC.
func TransportOf(f *frame.Frame) []byte {
	ip := f.Packet()
	hl := frame.IPv4Len
	if f.IsIPv6() {
		hl = frame.IPv6Len
	}
	return ip[hl+frame.UDPLen : len(ip)-bth.ICRCLen]
}

// Frame parses b, an Ethernet frame, fails t unless it is RoCEv2 with a
// valid ICRC and every check passes, and returns it parsed.
func Frame(t testing.TB, b []byte, checks ...FrameCheck) *frame.Frame {
	t.Helper()
	f := new(frame.Frame)
	if err := frame.Parse(b, f); err != nil {
		t.Fatalf("frame of %d bytes: %v", len(b), err)
	}
	if !f.VerifyICRC() {
		t.Fatalf("frame %v: bad ICRC", f.Opcode())
	}
	var errs []string
	for _, c := range checks {
		if err := c(f); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		t.Fatalf("frame %v %v→%v: %s", f.Opcode(), f.Src(), f.Dst(), strings.Join(errs, "; "))
	}
	return f
}
