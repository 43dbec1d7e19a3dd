package transport

import (
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
)

// GRHLen is the slot every UD receive buffer reserves for the GRH (IPv4: 20
// zero bytes then the IPv4 header; IPv6: the IPv6 header).
const GRHLen = 40

// Meta is what the device knows about a received packet besides its
// transport bytes, all of it checked before the transport sees the packet.
type Meta struct {
	// Src is the sender's address (a UD receive's source GID).
	Src netip.Addr
	// ECN is the IP header's ECN field (3: CE, congestion experienced).
	ECN uint8
	// GRH is the 40-byte GRH a UD receive places in front of the payload,
	// built from the IP header; nil for connected transports.
	GRH *[GRHLen]byte
	// RecvWindow is how many packets the device can take from this QP's
	// peer at once now: its share of the port's receive buffers among the
	// QPs receiving (0: no limit). A transport that can tell its peer (a
	// selective-repeat responder, in its SACKETH) does.
	RecvWindow int
	// RxAway is how long the engine was away from the port before the
	// poll that returned this packet (0 when it was waiting in the port,
	// woken by the packet, or unknown): the longest the packet can have
	// queued in this host before the transport saw it. Congestion control
	// splits end-host delay from fabric delay with it.
	RxAway time.Duration
}

// Transport is one QP's transport as the device drives it.
type Transport interface {
	// Modify applies a QP state transition the device has checked against
	// IBA's rules, with the QP's attributes as they now are: the receive
	// side at RTR, the send side at RTS, draining at SQD, resuming a
	// stopped send queue when leaving SQE. RESET and ERR are the device's
	// (a new transport; Flush).
	Modify(from, to ib.QPState, a *ib.QPAttr)

	// Post appends a send WQE (its SG slice is copied, not the memory it
	// names); false when the send queue is full.
	Post(w *ib.SendWQE) bool
	// SendQueueFree is how many more send WQEs Post accepts now.
	SendQueueFree() int

	// MaxPacket is the largest packet BuildHeader describes: headers,
	// payload and pad.
	MaxPacket() int
	// BuildHeader writes the headers of the next packet to send (the BTH,
	// its PadCount set, and the extended headers) into hdr, which holds
	// MaxPacket bytes, describes the packet's payload in pay (which the
	// device has reset) and returns the headers' length, 0 when there is
	// nothing to send now. The device puts the payload and its pad behind
	// the headers before it calls the transport again.
	BuildHeader(now clock.Time, hdr []byte, pay *Payload) int
	// Sent reports that the packet BuildHeader built last left as a frame
	// of wire bytes (headers and ICRC included): what a rate limiter
	// charges.
	Sent(now clock.Time, wire int)
	// Receive processes one received transport packet.
	Receive(now clock.Time, pkt []byte, m *Meta)
	// Expire runs the timers due at now.
	Expire(now clock.Time)
	// Deadline is when Expire must next run (clock.Never: no timer).
	Deadline() clock.Time
	// HasOutput reports whether BuildHeader would produce a packet now.
	HasOutput() bool

	// TakeCompletions returns the completions produced since the last
	// call; the slice is valid until the next call on the transport.
	TakeCompletions() []ib.WC
	// Failed reports a fatal error: the QP must go to ERR (then Flush).
	Failed() bool
	// Failure is the asynchronous event that error raises:
	// ib.EventQPReqErr when this QP's responder refused an invalid
	// request, ib.EventQPAccessErr when it refused a remote access
	// violation, ib.EventQPFatal for anything else.
	Failure() ib.EventType
	// SendError reports a local send error that stopped the send queue:
	// the QP goes to SQE (then FlushSend).
	SendError() bool
	// Flush completes every outstanding WQE with WR_FLUSH_ERR (ERR).
	Flush()
	// FlushSend completes every outstanding send WQE with WR_FLUSH_ERR,
	// leaving the receive side running (SQE).
	FlushSend()
	// Drained reports whether no send WQE is in progress (SQD's drain).
	Drained() bool
}

// Addressed is a transport whose packets each go where their WQE says (UD):
// the device looks at the next WQE's address handle before BuildHeader,
// to put the packet behind that destination's frame header.
type Addressed interface {
	// Peek returns the WQE BuildHeader will handle next, nil if none.
	Peek() *ib.SendWQE
}

// Payload is the payload of a packet as its transport describes it: Len
// bytes of the memory a scatter/gather list (or one Seg) names, from a
// byte offset in it on. A transport names its payload rather than copying
// it: the device gathers it into the frame, computing the ICRC as it
// copies, so that the memory is read once; and the memory may lie where
// only the device reaches it (see ib.Seg).
type Payload struct {
	sg  []ib.Seg
	one [1]ib.Seg
	off uint32
	n   uint32
}

// Set describes n bytes of sg from byte off of it on. sg (the slice, not
// the memory) must not change before the device gathers the payload.
func (p *Payload) Set(sg []ib.Seg, off, n uint32) { p.sg, p.off, p.n = sg, off, n }

// SetSeg describes n bytes of s from byte off of it on.
func (p *Payload) SetSeg(s ib.Seg, off, n uint32) {
	p.sg, p.one[0], p.off, p.n = nil, s, off, n
}

// Reset describes no payload.
func (p *Payload) Reset() { *p = Payload{} }

// Len is the payload's length in bytes, pad excluded.
func (p *Payload) Len() int { return int(p.n) }

// Memory returns the scatter/gather list the payload is in and the byte
// offset in it where the payload starts.
func (p *Payload) Memory() (sg []ib.Seg, off uint32) {
	if p.sg == nil {
		return p.one[:], p.off
	}
	return p.sg, p.off
}
