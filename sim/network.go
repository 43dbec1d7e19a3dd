package sim

import (
	"math"
	"math/rand/v2"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
)

// Packet kinds.
const (
	pktData uint8 = iota
	pktCNP
)

// CNPSize is a RoCEv2 CNP on the wire: Ethernet 14 + IPv4 20 + UDP 8 + BTH
// 12 + 16 reserved bytes + ICRC 4 + FCS 4.
const CNPSize = 78

// packet lives in the simulator's slab; index links make the FIFOs and the
// free list, so the steady state allocates nothing.
type packet struct {
	flow   int32
	size   int32
	kind   uint8
	ce     bool
	dst    int32 // destination node
	inPort int32 // ingress port at the current switch, for PFC accounting; -1 elsewhere
	next   int32 // FIFO or free-list link
}

// MarkAt says where a switch port applies RED/ECN marking.
type MarkAt uint8

const (
	// MarkDequeue marks on the queue left behind when a packet departs, as
	// both ns-3 DCQCN codebases do. Default.
	MarkDequeue MarkAt = iota
	// MarkEnqueue marks on the queue a packet joins (what a tc-bpf marker in
	// front of a qdisc can do).
	MarkEnqueue
	// MarkOff disables ECN marking.
	MarkOff
)

// RED is a port's ECN marking ramp on instantaneous queue bytes q: no mark
// at q ≤ Kmin, probability Pmax·(q−Kmin)/(Kmax−Kmin) up to Kmax, always
// above.
type RED struct {
	Kmin, Kmax int64
	Pmax       float64
}

// fifo is a packet queue threaded through the slab.
type fifo struct{ head, tail int32 }

// port is one direction of a cable: an output queue and a transmitter at
// one node, feeding the node at the other end after a propagation delay.
type port struct {
	name    string
	node    int32 // node that transmits on this port
	peer    int32 // node at the other end
	reverse int32 // the peer's port on the same cable
	rate    congestion.Rate
	delay   clock.Time

	busy bool
	rem  float64 // sub-ns serialisation time carried to the next packet

	data, hi       fifo // data queue; strict-priority control queue (CNPs)
	qBytes, hiByte int64
	limit          int64 // tail-drop limit on qBytes
	paused         bool  // PFC: a PAUSE from the peer holds data back

	// PFC state of this port as an ingress of its switch.
	inBytes   int64
	pauseSent bool

	markAt MarkAt
	red    RED
	rng    *rand.Rand

	txData, marks, drops, pauses uint64
	txBytesWindow                int64
	monitored                    bool
	maxQ                         int64
}

type nodeKind uint8

const (
	hostNode nodeKind = iota
	switchNode
)

type node struct {
	name   string
	kind   nodeKind
	ports  []int32
	route  []int32 // switch: egress port per destination node
	flows  []int32 // host: flows it sends
	rr     int     // host: round-robin start among its flows
	wakeAt clock.Time
}

// flow is one QP's traffic from src to dst, with the real DCQCN RP and
// pacer at the sender and the real NP at the receiver.
type flow struct {
	id         int
	src, dst   int32
	start      clock.Time
	size       int64 // bytes to send; 0 = unlimited
	sent, rcvd int64
	started    bool
	finish     clock.Time // receiver got the last byte; -1 while running

	rp    dcqcn.RP
	np    dcqcn.NP
	pacer congestion.Pacer
	rpAt  clock.Time      // deadline an evRPTimer is scheduled for
	rate  congestion.Rate // the RP's rate the pacer last saw (Options.Retime)
	npAt  clock.Time

	cnpRcvd uint64
	bins    []int64 // bytes received per 1 ms bin (statistics)
	tbins   []int64 // bytes received per trace bin, when that is not 1 ms
}

// net is the simulated network and its clock.
type net struct {
	now    clock.Time
	end    clock.Time
	events uint64
	h      eventHeap

	nodes []node
	ports []port
	flows []flow
	pkts  []packet
	free  int32

	pktSize    int
	retime     bool // Options.Retime
	pfc        bool
	xoff, xon  int64
	binWidth   clock.Time // statistics bins: 1 ms
	traceWidth clock.Time // throughput trace bins

	progress      func(now, end clock.Time)
	cfg           RunConfig
	window        [2]clock.Time
	sampler       sampler
	bottleneck    int32
	bytesInWindow int64
}

func (n *net) schedule(at clock.Time, kind evKind, obj, pkt, aux int32) {
	n.h.push(event{at: at, kind: kind, obj: obj, pkt: pkt, aux: aux})
}

func (n *net) alloc() int32 {
	if n.free >= 0 {
		i := n.free
		n.free = n.pkts[i].next
		return i
	}
	n.pkts = append(n.pkts, packet{})
	return int32(len(n.pkts) - 1)
}

func (n *net) release(i int32) {
	n.pkts[i].next = n.free
	n.free = i
}

func (n *net) enqueue(q *fifo, i int32) {
	n.pkts[i].next = -1
	if q.head < 0 {
		q.head, q.tail = i, i
		return
	}
	n.pkts[q.tail].next = i
	q.tail = i
}

func (n *net) dequeue(q *fifo) int32 {
	i := q.head
	if i >= 0 {
		q.head = n.pkts[i].next
		if q.head < 0 {
			q.tail = -1
		}
	}
	return i
}

// run fires events in (time, sequence) order until end.
func (n *net) run() {
	n.runUntil()
	n.now = n.end
}

// runUntil fires the events due at or before end and leaves later ones
// queued, so a run can be continued by raising end.
func (n *net) runUntil() {
	const progressEvery = 1 << 16
	for n.h.len() > 0 {
		if n.h.ev[0].at > n.end {
			break
		}
		e := n.h.pop()
		n.now = e.at
		n.events++
		if n.progress != nil && n.events%progressEvery == 0 {
			n.progress(n.now, n.end)
		}
		n.dispatch(&e)
	}
}

func (n *net) dispatch(e *event) {
	switch e.kind {
	case evFlowStart:
		f := &n.flows[e.obj]
		f.started = true
		n.hostTry(f.src)
	case evHostWake:
		if nd := &n.nodes[e.obj]; nd.wakeAt == e.at {
			nd.wakeAt = clock.Never
			n.hostTry(e.obj)
		}
	case evTxDone:
		p := &n.ports[e.obj]
		p.busy = false
		n.kick(e.obj)
	case evArrive:
		n.arrive(e.obj, e.pkt, e.aux)
	case evRPTimer:
		f := &n.flows[e.obj]
		if f.rpAt != e.at {
			return // superseded
		}
		f.rpAt = clock.Never
		f.rp.OnTimer(n.now)
		n.afterRP(f)
		n.hostTry(f.src)
	case evNPTimer:
		f := &n.flows[e.obj]
		if f.npAt != e.at {
			return
		}
		f.npAt = clock.Never
		if f.np.OnTimer(n.now) {
			n.sendCNP(f)
		}
		n.afterNP(f)
	case evPFC:
		p := &n.ports[e.obj]
		p.paused = e.aux == 1
		if p.paused {
			p.pauses++
		} else {
			n.kick(e.obj)
		}
	case evSample:
		n.sample()
	}
}

// afterRP (re)arms the flow's RP timer when its deadline moved and, with
// Options.Retime, applies a rate change to the pacer's pending gap.
func (n *net) afterRP(f *flow) {
	if n.retime {
		if r := f.rp.Rate(); r != f.rate {
			f.pacer.Retime(n.now, f.rate, r, n.pktSize)
			f.rate = r
		}
	}
	if d := f.rp.Deadline(); d != f.rpAt {
		f.rpAt = d
		if d != clock.Never {
			n.schedule(d, evRPTimer, int32(f.id), -1, 0)
		}
	}
}

func (n *net) afterNP(f *flow) {
	if d := f.np.Deadline(); d != f.npAt {
		f.npAt = d
		if d != clock.Never {
			n.schedule(max(d, n.now), evNPTimer, int32(f.id), -1, 0)
			f.npAt = max(d, n.now)
		}
	}
}

// kick starts a transmission on an idle port.
func (n *net) kick(pi int32) {
	p := &n.ports[pi]
	if p.busy {
		return
	}
	if n.nodes[p.node].kind == hostNode {
		n.hostTry(p.node)
		return
	}
	if i := n.dequeue(&p.hi); i >= 0 {
		p.hiByte -= int64(n.pkts[i].size)
		n.startTx(pi, i)
		return
	}
	if p.paused {
		return
	}
	i := n.dequeue(&p.data)
	if i < 0 {
		return
	}
	pk := &n.pkts[i]
	p.qBytes -= int64(pk.size)
	if pk.inPort >= 0 {
		n.ingressRelease(pk.inPort, int64(pk.size))
		pk.inPort = -1
	}
	if p.markAt == MarkDequeue && n.mark(p, p.qBytes) {
		pk.ce = true
	}
	p.txData++
	if p.monitored && n.now >= n.window[0] && n.now < n.window[1] {
		p.txBytesWindow += int64(pk.size)
	}
	n.startTx(pi, i)
}

// startTx serialises packet i on port pi: the port is busy for size·8/rate
// and the packet reaches the peer one propagation delay after its last bit.
func (n *net) startTx(pi, i int32) {
	p := &n.ports[pi]
	p.busy = true
	t := float64(n.pkts[i].size)*8e9/float64(p.rate) + p.rem
	whole := math.Floor(t)
	p.rem = t - whole
	done := n.now + clock.Time(whole)
	n.schedule(done, evTxDone, pi, -1, 0)
	n.schedule(done+p.delay, evArrive, p.peer, i, p.reverse)
}

// mark draws the RED decision for a data packet seeing q queued bytes.
func (n *net) mark(p *port, q int64) bool {
	r := &p.red
	switch {
	case q <= r.Kmin:
		return false
	case q > r.Kmax:
		p.marks++
		return true
	}
	if p.rng.Float64() < r.Pmax*float64(q-r.Kmin)/float64(r.Kmax-r.Kmin) {
		p.marks++
		return true
	}
	return false
}

// arrive delivers packet i to node ni, which received it on port in.
func (n *net) arrive(ni, i, in int32) {
	nd := &n.nodes[ni]
	pk := &n.pkts[i]
	if nd.kind == hostNode {
		n.deliver(i)
		return
	}
	out := nd.route[pk.dst]
	p := &n.ports[out]
	if pk.kind != pktData {
		n.enqueue(&p.hi, i)
		p.hiByte += int64(pk.size)
		n.kick(out)
		return
	}
	if p.qBytes+int64(pk.size) > p.limit {
		p.drops++
		n.release(i)
		return
	}
	p.qBytes += int64(pk.size)
	p.maxQ = max(p.maxQ, p.qBytes)
	if p.markAt == MarkEnqueue && n.mark(p, p.qBytes) {
		pk.ce = true
	}
	pk.inPort = in
	n.ingressHold(in, int64(pk.size))
	n.enqueue(&p.data, i)
	n.kick(out)
}

// ingressHold and ingressRelease keep PFC's per-ingress byte count: past
// xoff the switch pauses the upstream port, below xon it resumes it. The
// PAUSE takes effect one propagation delay later (its serialisation is
// ignored).
func (n *net) ingressHold(in int32, b int64) {
	p := &n.ports[in]
	p.inBytes += b
	if n.pfc && !p.pauseSent && p.inBytes > n.xoff {
		p.pauseSent = true
		n.schedule(n.now+p.delay, evPFC, p.reverse, -1, 1)
	}
}

func (n *net) ingressRelease(in int32, b int64) {
	p := &n.ports[in]
	p.inBytes -= b
	if p.pauseSent && p.inBytes <= n.xon {
		p.pauseSent = false
		n.schedule(n.now+p.delay, evPFC, p.reverse, -1, 0)
	}
}

// deliver hands a packet to its destination host: data feeds the flow's NP
// (which may answer with a CNP), a CNP feeds the sender's RP.
func (n *net) deliver(i int32) {
	pk := n.pkts[i]
	n.release(i)
	f := &n.flows[pk.flow]
	switch pk.kind {
	case pktData:
		f.rcvd += int64(pk.size)
		b := int(n.now / n.binWidth)
		for len(f.bins) <= b {
			f.bins = append(f.bins, 0)
		}
		f.bins[b] += int64(pk.size)
		if n.traceWidth != n.binWidth {
			b := int(n.now / n.traceWidth)
			for len(f.tbins) <= b {
				f.tbins = append(f.tbins, 0)
			}
			f.tbins[b] += int64(pk.size)
		}
		if f.size > 0 && f.rcvd >= f.size && f.finish < 0 {
			f.finish = n.now
		}
		if f.np.OnPacket(n.now, pk.ce) {
			n.sendCNP(f)
		}
		n.afterNP(f)
	case pktCNP:
		f.cnpRcvd++
		f.rp.OnCNP(n.now)
		n.afterRP(f)
		n.hostTry(f.src)
	}
}

// sendCNP queues a CNP from the flow's receiver back to its sender, ahead
// of any data on the receiver's NIC.
func (n *net) sendCNP(f *flow) {
	i := n.alloc()
	n.pkts[i] = packet{flow: int32(f.id), size: CNPSize, kind: pktCNP, dst: f.src, inPort: -1, next: -1}
	pi := n.nodes[f.dst].ports[0]
	p := &n.ports[pi]
	n.enqueue(&p.hi, i)
	p.hiByte += CNPSize
	n.kick(pi)
}

// hostTry lets a host's NIC send its next packet if the link is free: a
// queued CNP first, then the data flow whose pacer allows the earliest
// departure (round-robin among ties, like HPCC's QP scheduler). If no flow
// may send yet, it sets a wake-up for the earliest pacer time.
func (n *net) hostTry(hi int32) {
	nd := &n.nodes[hi]
	pi := nd.ports[0]
	p := &n.ports[pi]
	if p.busy {
		return
	}
	if i := n.dequeue(&p.hi); i >= 0 {
		p.hiByte -= int64(n.pkts[i].size)
		n.startTx(pi, i)
		return
	}
	if p.paused || len(nd.flows) == 0 {
		return
	}
	best, bestAt := -1, clock.Never
	for k := range nd.flows {
		j := (nd.rr + k) % len(nd.flows)
		f := &n.flows[nd.flows[j]]
		if !f.started || (f.size > 0 && f.sent >= f.size) {
			continue
		}
		if at := f.pacer.Next(n.now, f.rp.Rate(), n.pktSize); at < bestAt {
			best, bestAt = j, at
		}
	}
	if best < 0 {
		return
	}
	if bestAt > n.now {
		if bestAt < nd.wakeAt {
			nd.wakeAt = bestAt
			n.schedule(bestAt, evHostWake, hi, -1, 0)
		}
		return
	}
	nd.rr = best + 1
	f := &n.flows[nd.flows[best]]
	size := int64(n.pktSize)
	if f.size > 0 {
		size = min(size, f.size-f.sent)
	}
	f.pacer.Sent(n.now, f.rp.Rate(), int(size))
	f.sent += size
	f.rp.OnPacketSent(n.now, int(size))
	n.afterRP(f)
	i := n.alloc()
	n.pkts[i] = packet{flow: int32(f.id), size: int32(size), kind: pktData, dst: f.dst, inPort: -1, next: -1}
	p.txData++
	n.startTx(pi, i)
}
