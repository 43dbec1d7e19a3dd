package rnic

import (
	"net/netip"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/icrc"
	"github.com/softrnic/softrnic/transport"
)

func (d *Device) isLocal(a netip.Addr) bool {
	a = a.Unmap()
	for _, l := range d.cfg.Addrs {
		if l == a {
			return true
		}
	}
	return false
}

// Receive processes a batch of received frames (engine goroutine). The
// frames are not retained. Frames for the same QP in a row are handled
// under one acquisition of its lock.
func (d *Device) Receive(now clock.Time, frames [][]byte) {
	var cur *QP
	f := &d.rxf
	for _, b := range frames {
		d.Stats.RxFrames++
		if frame.Parse(b, f) != nil {
			d.Stats.RxParseErr++
			continue
		}
		if !d.isLocal(f.Dst()) {
			d.Stats.RxNotLocal++
			continue
		}
		h := f.BTH()
		if h.TVer() != 0 || h.PKey()&0x7FFF != 0x7FFF {
			d.Stats.RxBadHeader++
			continue
		}
		q := d.qps.get(h.DestQP())
		if q == nil {
			d.Stats.RxNoQP++
			continue
		}
		if !f.VerifyICRC() {
			d.Stats.RxBadICRC++
			continue
		}
		if q != cur {
			if cur != nil {
				cur.releaseEngine()
			}
			q.mu.Lock()
			cur = q
		}
		d.deliver(now, q, f)
	}
	if cur != nil {
		cur.releaseEngine()
	}
}

// deliver hands a checked frame to q's transport; q.mu is held.
func (d *Device) deliver(now clock.Time, q *QP, f *frame.Frame) {
	pkt := f.Packet()
	ipLen := 20
	if f.IsIPv6() {
		ipLen = 40
	}
	tp := pkt[ipLen+frame.UDPLen : len(pkt)-icrc.Len]
	op := f.Opcode()
	m := &d.meta // the device's, not a local: the transport call would move a local to the heap
	*m = transport.Meta{Src: f.Src(), ECN: f.ECN(), RxAway: d.rxAway}
	src := m.Src.Unmap()
	if op == bth.CNP {
		// A CNP is for a connected QP's reaction point, from its peer.
		d.Stats.RxCNP++
		if !q.init.Type.Connected() || !q.state.Sending() {
			d.Stats.RPCNPIgnored++
			return
		}
		if src != q.peer {
			d.Stats.RxBadSrc++
			return
		}
		q.tr.Receive(now, tp, m)
		return
	}
	var want bth.Transport
	switch q.init.Type {
	case ib.UC:
		want = bth.TransportUC
	case ib.UD, ib.GSI:
		want = bth.TransportUD
	default:
		want = bth.TransportRC
	}
	if op.Transport() != want {
		d.Stats.RxBadType++
		return
	}
	if !q.state.Receiving() {
		d.Stats.RxBadState++
		return
	}
	if want == bth.TransportUD {
		if f.IsIPv6() {
			copy(d.grh[:], f.IPv6())
		} else {
			clear(d.grh[:20])
			copy(d.grh[20:], f.IPv4())
		}
		m.GRH = &d.grh
	} else {
		if src != q.peer {
			d.Stats.RxBadSrc++
			return
		}
		if q.state == ib.RTR && !q.commEst {
			q.commEst = true
			d.event(ib.EventCommEst, q.qpn)
		}
	}
	q.tr.Receive(now, tp, m)
}
