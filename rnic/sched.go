package rnic

import (
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/icrc"
)

// txBudget bounds the packets one QP may send per Transmit call so that
// QPs share the link round-robin.
const txBudget = 16

// Transmit builds up to len(out) frames into the caller's buffers (the
// engine's are lent by its port: the frames are written where the port
// sends them from) and returns how many; out[i] is resliced to the frame
// (its capacity must hold the port's largest frame:
// 14+40+8+BTH+headers+MTU+3+4 bytes).
// Only QPs with something to send are visited, round-robin, at most
// txBudget frames each per visit; the rounds go on while some QP used its
// whole budget and out has room, so that one busy QP fills the batch (one
// sendto(2) per batch on AF_XDP: a single 64 KiB WRITE stream sent 16
// frames per call with a single round).
func (d *Device) Transmit(now clock.Time, out [][]byte) int {
	d.takeHandover()
	n := 0
	if len(d.ready) == 0 {
		return 0
	}
	// The ready list is in the order the QPs got output. Served in that
	// order, a QP's ACK of a message whose completion the application
	// has just polled leaves before what the application posts next on
	// another QP (a DREQ on QP1 must not overtake it: the peer would
	// flush the message's send). The start rotates only while calls
	// leave QPs unserved, for fairness among streams.
	start := 0
	if d.rotate {
		start = d.rr % len(d.ready)
		d.rr++
	}
	for more := true; more && n < len(out); {
		more = false
		for visited := 0; visited < len(d.ready) && n < len(out); visited++ {
			q := d.ready[(start+visited)%len(d.ready)]
			q.mu.Lock()
			mtu := int(q.attr.PathMTU)
			if mtu == 0 {
				mtu = 4096
			}
			b := 0
			for ; b < txBudget && n < len(out) && !d.loopFull(); b++ {
				// What this QP may still send in this call bounds its
				// read-ahead: its visit's budget, or every frame left
				// when it is the only QP (its next rounds use the rest).
				frames := txBudget - b
				if len(d.ready) == 1 {
					frames = len(out) - n
				}
				d.dmaReadLimit(min(frames, len(out)-n), mtu)
				m := d.buildFrame(now, q, out[n][:cap(out[n])])
				if m == 0 {
					break
				}
				if d.looped(out[n][:m]) {
					continue
				}
				out[n] = out[n][:m]
				n++
			}
			q.releaseEngine()
			more = more || b == txBudget
		}
	}
	d.rotate = n == len(out) || d.loopFull()
	// Forget the QPs that have nothing more to send.
	keep := d.ready[:0]
	for _, q := range d.ready {
		if q.stillPending() {
			keep = append(keep, q)
		}
	}
	clear(d.ready[len(keep):])
	d.ready = keep
	d.dmaEndTransmit()
	d.Stats.TxFrames += uint64(n)
	d.deliverLooped(now)
	return n
}

// buildFrame writes q's next frame into buf; q.mu is held. The frame
// header is the QP's (connected), its CNP header for a CNP, or the one of
// the next WQE's address handle (datagrams). The transport writes its
// headers behind it and names its payload, which seal gathers.
func (d *Device) buildFrame(now clock.Time, q *QP, buf []byte) int {
	if q.state == ib.Reset || q.state == ib.Init {
		return 0
	}
	for {
		h := q.hdr.Bytes()
		if q.dest != nil {
			w := q.dest.Peek()
			if w == nil {
				return 0
			}
			h = nil // no address handle: the transport completes the WQE in error
			if w.AH != nil {
				h = w.AH.Header
			}
		}
		if len(buf) < len(h)+q.tr.MaxPacket()+icrc.Len {
			return 0
		}
		p := &d.pay
		p.Reset()
		m := q.tr.BuildHeader(now, buf[len(h):], p)
		if m == 0 {
			if q.dest != nil {
				continue // a WQE completed in error: try the next
			}
			return 0
		}
		if q.dest == nil && bth.BTH(buf[len(h):]).Opcode() == bth.CNP {
			h = q.cnpHdr.Bytes()
		}
		n := d.seal(buf, h, m, p)
		if d.dma.fault {
			// Its payload could not be read (dma.go): never sent; the
			// QP goes to ERR when the engine releases it.
			d.dma.fault = false
			q.dmaFault = true
			return 0
		}
		q.tr.Sent(now, n)
		return n
	}
}

// stillPending reports whether q stays in the ready list; when it leaves,
// a post racing with the decision re-queues it through the handover.
func (q *QP) stillPending() bool {
	if q.txPending.Load() && !q.destroyed.Load() {
		return true
	}
	q.queued.Store(false)
	return q.txPending.Load() && !q.destroyed.Load() && q.queued.CompareAndSwap(false, true)
}

// stillTimed is stillPending for the timer list.
func (q *QP) stillTimed() bool {
	if clock.Time(q.deadline.Load()) != clock.Never && !q.destroyed.Load() {
		return true
	}
	q.timed.Store(false)
	return clock.Time(q.deadline.Load()) != clock.Never && !q.destroyed.Load() && q.timed.CompareAndSwap(false, true)
}

// handOver queues q for the engine (from any goroutine).
func (d *Device) handOver(q *QP, ready, timed bool) {
	d.handMu.Lock()
	if ready {
		d.handReady = append(d.handReady, q)
	}
	if timed {
		d.handTimed = append(d.handTimed, q)
	}
	d.handMu.Unlock()
	d.handedOver.Store(true)
}

// takeHandover moves handed-over QPs into the engine's lists.
func (d *Device) takeHandover() {
	if !d.handedOver.Load() {
		return
	}
	d.handMu.Lock()
	d.handedOver.Store(false)
	d.ready = append(d.ready, d.handReady...)
	d.timed = append(d.timed, d.handTimed...)
	clear(d.handReady)
	clear(d.handTimed)
	d.handReady, d.handTimed = d.handReady[:0], d.handTimed[:0]
	d.handMu.Unlock()
}

// NextDeadline is the earliest timer deadline of any QP (clock.Never if
// none): the engine sleeps until then unless frames or the doorbell wake
// it. Only QPs with a timer armed are looked at.
func (d *Device) NextDeadline() clock.Time {
	d.takeHandover()
	t := clock.Never
	keep := d.timed[:0]
	for _, q := range d.timed {
		if q.stillTimed() {
			keep = append(keep, q)
			t = clock.Min(t, clock.Time(q.deadline.Load()))
		}
	}
	clear(d.timed[len(keep):])
	d.timed = keep
	return t
}

// Expire runs the timers of every QP whose deadline is at or before now.
func (d *Device) Expire(now clock.Time) {
	d.takeHandover()
	for _, q := range d.timed {
		if clock.Time(q.deadline.Load()) > now {
			continue
		}
		q.mu.Lock()
		q.tr.Expire(now)
		q.releaseEngine()
	}
}

// HasOutput reports whether some QP may have frames to send.
func (d *Device) HasOutput() bool {
	return len(d.ready) > 0 || d.handedOver.Load()
}

// Doorbell receives a value when applications post work (coalescing: one
// value may stand for many posts). An idle engine waits on it together
// with its port and its next deadline.
func (d *Device) Doorbell() <-chan struct{} { return d.doorbell }

// DefaultPollFresh is how recently an application must have polled (Poll)
// for a post to leave the doorbell alone (Config.PollFresh): the poster
// is then spinning on its CQ and its next Poll transmits the WQE in its
// own goroutine, batched with whatever else it posts meanwhile, where a
// doorbell would wake the engine goroutine (a futex wake-up on an idle
// core, and a goroutine that takes the CPU the other end of a ping-pong
// needs on a small machine).
// If the application stops polling instead, the engine finds the WQE at
// the end of its nap (engine.Options.PolledWait).
const DefaultPollFresh = 10 * time.Microsecond

func (d *Device) ring() {
	if d.poller.Load() != nil && clock.Now().Sub(clock.Time(d.polledAt.Load())) < d.cfg.PollFresh {
		d.ringsSkipped.Add(1)
		return
	}
	d.Wake()
}
