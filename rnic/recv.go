package rnic

import (
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/icrc"
	"github.com/softrnic/softrnic/transport"
	"github.com/softrnic/softrnic/transport/rc"
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
	d.shareStart(now)
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
			d.share.count(q, now)
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
	*m = transport.Meta{Src: f.Src(), ECN: f.ECN(), RxAway: d.rxAway, RecvWindow: d.share.window(d.cfg.RxFrames)}
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
		d.heard[q.slot] = now
		if q.state == ib.RTR && !q.commEst {
			q.commEst = true
			d.event(ib.EventCommEst, q.qpn)
		}
		if d.hostMarks && m.ECN != frame.CE && rc.NPAnswers(op) &&
			d.hostCC.Mark(now, &q.hostMark, d.cfg.Congestion.NP.MinInterval) {
			// Host congestion: the QP's notification point answers
			// this packet as if the network had marked it.
			m.ECN = frame.CE
			d.Stats.NPHostCCMarks++
		}
	}
	q.tr.Receive(now, tp, m)
}

// SetRxLevel tells the device how its port's receive buffers stand before
// the frames it hands to the next Receive (port.RxGauge: fill buffers
// wait for the network, queued frames wait for the device, out of
// buffers), read at now. Under DCQCN the device signals host congestion
// with it (Config.HostCC). A driver that does not call it signals none.
func (d *Device) SetRxLevel(now clock.Time, fill, queued, buffers int) {
	d.hostCC.Observe(now, fill, queued, buffers)
}

// HostCCCounters returns what the device's host-congestion detector saw
// (engine goroutine, or after it stopped).
func (d *Device) HostCCCounters() dcqcn.HostCCCounters { return d.hostCC.HostCCCounters }

// rxShare divides the port's receive frames among the QPs receiving. A
// host that many requesters send into at once (fan-in: MPI, storage
// targets, perftest -q 64) would otherwise take every requester's full
// window at once, far more frames than its port holds, and drop them
// (an AF_XDP socket whose FILL ring is empty drops what arrives): go-back-N
// peers then resend whole windows into the same overflow. Each QP's
// selective-repeat peer is told, in every SACKETH, how many packets it may
// have outstanding: half the port's frames shared among the QPs that
// received in the last shareHorizon (the other half is slack for bursts,
// ACKs and other traffic). The transport lets a window grow only so fast
// (transport/rc), so that the first QPs of a crowd to start do not take
// the share of those about to.
type rxShare struct {
	n     int        // QPs that received within shareHorizon, as of the last sweep and since
	swept clock.Time // the last sweep
}

// shareHorizon is how long a QP counts as receiving after its last
// request: long against the stalls of a loaded software host, whose engine
// may not run for milliseconds and then finds only a few QPs' frames in its
// first batch.
const shareHorizon = clock.Time(100 * time.Millisecond)

// minRecvWindow floors a QP's receive window: enough to keep a message
// moving, whatever the share.
const minRecvWindow = 4

// start begins a batch received at now: every quarter horizon, the count
// is made again from the QPs' last receive times (a walk of the QP table,
// from the engine goroutine that alone writes them).
func (d *Device) shareStart(now clock.Time) {
	s := &d.share
	if now-s.swept < shareHorizon/4 {
		return
	}
	s.swept, s.n = now, 0
	d.qps.each(func(q *QP) {
		if q.rxLast != 0 && now-q.rxLast < shareHorizon {
			s.n++
		}
	})
}

// count notes that q receives at now.
func (s *rxShare) count(q *QP, now clock.Time) {
	if q.rxLast == 0 || now-q.rxLast >= shareHorizon {
		s.n++
	}
	q.rxLast = now
}

// window is a receiving QP's share of frames (0: frames unknown, no
// window).
func (s *rxShare) window(frames int) int {
	if frames == 0 {
		return 0
	}
	return max(frames/2/max(s.n, 1), minRecvWindow)
}

// peerSlots is the size of Device.heard: peers whose addresses share a
// slot count as heard together, which only lends one's liveness to the
// other for a bounded number of timeouts (rc.QP.HeardFrom).
const peerSlots = 64

// peerSlot is a peer address's entry in Device.heard.
func peerSlot(a netip.Addr) int {
	b := a.As16()
	h := uint32(2166136261)
	for _, c := range b {
		h = (h ^ uint32(c)) * 16777619
	}
	return int(h % peerSlots)
}
