package rnic

import (
	"hash/fnv"
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
	d.share.took(now, len(frames))
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
// with it (Congestion.HostCC). A driver that does not call it signals none.
func (d *Device) SetRxLevel(now clock.Time, fill, queued, buffers int) {
	d.share.level(now, queued)
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
//
// The frames are also bounded in time. A software RNIC drains its port
// only as fast as its CPU share allows: on a loaded host the engine may
// take a few thousand frames a second, and half of a port sized for 128
// QPs then waits there for most of a second. Every requester's ACKs wait
// behind it, and their local ACK timers give up (RETRY_EXC_ERR) with no
// frame lost. So the device measures how long frames wait in the port
// (the sojourn of the buffers it sees waiting, as CoDel does), and when
// even the shortest wait of an interval exceeds maxQueueDelay (a standing
// queue, not a burst), it holds the windows together to what it drained
// in maxQueueDelay during that interval; each interval without a
// standing queue doubles the bound back until the frames' own is reached.
type rxShare struct {
	n     int        // QPs that received within shareHorizon, as of the last sweep and since
	swept clock.Time // the last sweep
	got   int        // frames taken since the last sweep
	taken uint64     // frames taken ever
	// The sojourn being measured: since markAt, the buffers then waiting,
	// all taken once taken reaches markEnd (a frame of several buffers
	// makes it err long).
	markAt  clock.Time
	markEnd uint64
	tookAt  clock.Time    // the last batch taken
	wait    time.Duration // the shortest sojourn since the last sweep (-1: none)
	budget  int           // frames all windows may total (0: no bound but the frames')
}

// shareHorizon is how long a QP counts as receiving after its last
// request: long against the stalls of a loaded software host, whose engine
// may not run for milliseconds and then finds only a few QPs' frames in its
// first batch.
const shareHorizon = clock.Time(100 * time.Millisecond)

// maxQueueDelay is how long the receive windows together may make frames
// wait in the port: well under a local ACK timeout (perftest's and
// rdma_cm's default, 2^14 · 4.096 µs, is 67 ms), and above the queue a
// host that keeps up holds when every window is full.
const maxQueueDelay = 20 * time.Millisecond

// minRecvWindow floors a QP's receive window: enough to keep a message
// moving, whatever the share.
const minRecvWindow = 4

// start begins a batch received at now: every quarter horizon, the count
// is made again from the QPs' last receive times (a walk of the QP table,
// from the engine goroutine that alone writes them), and the time bound
// is set again from the interval that ended.
func (d *Device) shareStart(now clock.Time) {
	s := &d.share
	if !s.sweep(now, d.cfg.RxFrames) {
		return
	}
	d.qps.each(func(q *QP) {
		if q.rxLast != 0 && now-q.rxLast < shareHorizon {
			s.n++
		}
	})
}

// sweep ends the interval when a quarter horizon has passed: the time
// bound is set from it, and the count of QPs receiving starts again (the
// caller makes it).
func (s *rxShare) sweep(now clock.Time, frames int) bool {
	if now-s.swept < shareHorizon/4 {
		return false
	}
	if s.swept != 0 {
		if s.markAt != 0 && (s.wait < 0 || now.Sub(s.markAt) < s.wait) {
			s.wait = now.Sub(s.markAt) // still waiting: at least this long
		}
		s.bound(now.Sub(s.swept), frames)
	}
	s.swept, s.n, s.got, s.wait = now, 0, 0, -1
	return true
}

// level notes queued buffers waiting in the port at now, before a batch.
func (s *rxShare) level(now clock.Time, queued int) {
	if s.markAt != 0 && s.taken+uint64(queued) < s.markEnd {
		// Fewer wait than were marked: the marked ones are gone, taken
		// by the last batch at the latest (a frame of several buffers
		// was counted as several).
		s.finish(s.tookAt)
	}
	if s.markAt == 0 && queued > 0 {
		s.markAt, s.markEnd = now, s.taken+uint64(queued)
	}
}

// took notes n frames taken at now.
func (s *rxShare) took(now clock.Time, n int) {
	if n == 0 {
		return
	}
	s.got += n
	s.taken += uint64(n)
	s.tookAt = now
	if s.markAt != 0 && s.taken >= s.markEnd {
		s.finish(now)
	}
}

// finish ends the sojourn measured: the marked buffers were all taken at t.
func (s *rxShare) finish(t clock.Time) {
	if w := max(t.Sub(s.markAt), 0); s.wait < 0 || w < s.wait {
		s.wait = w
	}
	s.markAt = 0
}

// bound sets the frames all windows may total after an interval of
// length dt: what the device drained in maxQueueDelay if the interval had
// a standing queue, else twice the last bound, up to the frames' own. An
// interval much longer than a sweep's (the device idle, then a first
// batch) bounds nothing.
func (s *rxShare) bound(dt time.Duration, frames int) {
	switch {
	case frames == 0:
		s.budget = 0
	case s.wait > maxQueueDelay && dt <= time.Duration(shareHorizon):
		drained := int(int64(s.got) * int64(maxQueueDelay) / int64(max(dt, 1)))
		s.budget = max(drained, minRecvWindow)
	case s.budget != 0:
		if s.budget *= 2; s.budget >= frames/2 {
			s.budget = 0
		}
	}
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
	total := frames / 2
	if s.budget != 0 {
		total = min(total, s.budget)
	}
	return max(total/max(s.n, 1), minRecvWindow)
}

// peerSlots is the size of Device.heard: peers whose addresses share a
// slot count as heard together, which only lends one's liveness to the
// other for a bounded number of timeouts (rc.QP.HeardFrom).
const peerSlots = 64

// peerSlot is a peer address's entry in Device.heard (at connection
// setup, not per packet).
func peerSlot(a netip.Addr) int {
	h := fnv.New32a()
	b := a.As16()
	h.Write(b[:])
	return int(h.Sum32() % peerSlots)
}
