package rnic

import (
	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/icrc"
)

// Loopback: a QP may talk to a QP of its own device (same GID), as rxe
// lets it; test suites and applications with both ends on one host need
// it. The address vector of such a peer gets the device's own MAC as its
// next hop (destMAC), and Transmit hands every frame addressed to that
// MAC to the device's own receive path instead of the port: no wire, and
// every receive check (address, P_Key, QP, source, ICRC) still applies.
// A frame to one's own MAC could not come back from the wire anyway.

// loopFrames is how many looped frames Transmit holds before it delivers
// them; a QP that would loop more waits for the next Transmit.
const loopFrames = 32

// loopMaxFrame is the largest frame a device builds.
const loopMaxFrame = frame.EthernetLen + frame.IPv6Len + frame.UDPLen + bth.MaxHeaderLen + 4096 + 3 + icrc.Len

// looped reports whether f, a frame just built, is for the device itself,
// and if so keeps a copy of it for deliverLooped (Transmit stops building
// while loopFull).
func (d *Device) looped(f []byte) bool {
	if len(f) < 6 || [6]byte(f[:6]) != d.cfg.MAC {
		return false
	}
	if d.loopBuf == nil {
		// The first looped frame of the device: the buffers, once.
		d.loopBuf = make([]byte, loopFrames*loopMaxFrame)
		d.loop = make([][]byte, 0, loopFrames)
	}
	i := len(d.loop)
	b := d.loopBuf[i*loopMaxFrame : i*loopMaxFrame+len(f)]
	copy(b, f)
	d.loop = append(d.loop, b)
	d.Stats.LoopFrames++
	return true
}

// loopFull reports whether no more looped frames fit until the next
// delivery.
func (d *Device) loopFull() bool { return len(d.loop) == loopFrames }

// deliverLooped receives the frames Transmit looped back (no QP lock
// held).
func (d *Device) deliverLooped(now clock.Time) {
	if len(d.loop) == 0 {
		return
	}
	away := d.rxAway
	d.rxAway = 0 // no wait for a poll of the port: delivered as built
	d.Receive(now, d.loop)
	d.rxAway = away
	clear(d.loop)
	d.loop = d.loop[:0]
}
