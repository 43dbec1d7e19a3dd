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
	pktAck
)

// CNPSize is a RoCEv2 CNP on the wire: Ethernet 14 + IPv4 20 + UDP 8 + BTH
// 12 + 16 reserved bytes + ICRC 4 + FCS 4.
const CNPSize = 78

// AckSize is a RoCEv2 ACK on the wire: Ethernet 14 + IPv4 20 + UDP 8 + BTH
// 12 + AETH 4 + ICRC 4 + FCS 4. An ACK that echoes INT carries the data
// packet's INT header on top.
const AckSize = 66

// packet lives in the simulator's slab; index links make the FIFOs and the
// free list, so the steady state allocates nothing. A data packet that is
// acknowledged becomes its ACK in place: the ACK echoes the data packet's
// send time, CE mark, hop count and INT records without copying them.
type packet struct {
	sentAt  clock.Time // data: when the sender's NIC began sending it; ACK: echoed
	flow    int32
	size    int32 // bytes on the wire
	payload int32 // data: payload bytes; ACK: payload bytes it acknowledges
	acked   int32 // ACK: wire bytes of the data packets it acknowledges
	dst     int32 // destination node
	inPort  int32 // ingress port at the current switch, for PFC accounting; -1 elsewhere
	next    int32 // FIFO or free-list link
	hash    uint32
	kind    uint8
	ce      bool
	hops    uint8 // switches the data packet crossed
	nint    uint8 // INT records pushed (n.ints)
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

	data, hi       fifo // data queue; strict-priority control queue (CNPs, ACKs)
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
	txBytes                      int64 // data bytes sent, the INT txBytes counter
	txBytesWindow                int64
	monitored                    bool
	maxQ                         int64
}

type nodeKind uint8

const (
	hostNode nodeKind = iota
	switchNode
)

// nhop is a switch's next hops towards one destination: cnt equal-cost
// egress ports at net.nh[off:off+cnt].
type nhop struct{ off, cnt int32 }

type node struct {
	name   string
	kind   nodeKind
	ports  []int32
	route  []nhop  // switch: next hops per destination node
	flows  []int32 // host: flows it is sending
	rr     int     // host: round-robin start among its flows
	wakeAt clock.Time
	host   int32 // host: its ordinal among the hosts (addresses, fct.txt)

	qBytes, bufLimit int64 // switch: bytes queued in all its ports, shared limit (0: none)
}

// flow is one QP's traffic from src to dst: the sender's congestion
// controller (DCQCN's RP, HPCC, TIMELY or Swift) and pacer, and for DCQCN
// the receiver's notification point.
type flow struct {
	id       int
	src, dst int32
	start    clock.Time
	size     int64 // payload bytes to send; 0 = unlimited
	sent     int64 // payload bytes sent
	rcvd     int64 // payload bytes received
	wire     int64 // wire bytes sent
	acked    int64 // wire bytes acknowledged
	ackedPay int64 // payload bytes acknowledged
	started  bool
	finish   clock.Time // receiver got the last byte; -1 while running
	done     clock.Time // sender got the last ACK; -1 while running (ACKs only)
	hash     uint32     // ECMP hash of the data direction; ACKs use its complement
	sport    uint16     // fct.txt: source port
	incast   bool       // workload: part of an incast burst (dport 200)

	cc    congestion.Controller // nil once the flow is done
	rp    *dcqcn.RP             // cc, when the algorithm is DCQCN
	np    dcqcn.NP
	pacer congestion.Pacer
	ccAt  clock.Time      // deadline an evRPTimer is scheduled for
	rate  congestion.Rate // the controller's rate the pacer last saw (Options.Retime)
	npAt  clock.Time

	// Receiver: what the next ACK acknowledges.
	unackPkts           int
	unackWire, unackPay int64

	cnpRcvd uint64
	bins    []int64 // bytes received per 1 ms bin (statistics)
	tbins   []int64 // bytes received per trace bin, when that is not 1 ms
}

// net is the simulated network and its clock.
type net struct {
	now    clock.Time
	end    clock.Time
	events uint64
	q      *evq

	nodes []node
	ports []port
	flows []flow
	pkts  []packet
	free  int32
	nh    []int32 // next-hop ports, indexed by nhop

	alg         *algorithm
	pktSize     int // wire bytes of a full data packet (payload + headers + INT)
	payload     int // payload bytes of a full data packet
	hdr         int // wire bytes of headers per data packet, INT excluded
	ackSize     int
	acks        bool // receivers acknowledge data
	ackInterval int
	intStride   int                 // INT records per packet (the topology's most switch hops); 0: no INT
	ints        []congestion.INTHop // INT records, intStride per packet slot
	bins        bool                // record per-flow throughput bins

	retime     bool // Options.Retime
	pfc        bool
	xoff, xon  int64
	binWidth   clock.Time // statistics bins: 1 ms
	traceWidth clock.Time // throughput trace bins

	progress   func(now, end clock.Time)
	cfg        RunConfig
	window     [2]clock.Time
	sampler    sampler
	bottleneck int32

	work *workload // the workload scenario's state, nil otherwise
}

func (n *net) schedule(at clock.Time, kind evKind, obj, pkt, aux int32) {
	n.q.push(event{at: at, kind: kind, obj: obj, pkt: pkt, aux: aux})
}

func (n *net) alloc() int32 {
	if n.free >= 0 {
		i := n.free
		n.free = n.pkts[i].next
		return i
	}
	n.pkts = append(n.pkts, packet{})
	if n.intStride > 0 {
		n.ints = append(n.ints, make([]congestion.INTHop, n.intStride)...)
	}
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
	for {
		e, ok := n.q.pop(n.end)
		if !ok {
			break
		}
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
		n.startFlow(e.obj)
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
		if f.ccAt != e.at || f.cc == nil {
			return // superseded
		}
		f.ccAt = clock.Never
		f.cc.OnTimer(n.now)
		n.afterCC(f)
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

// startFlow puts a flow on its sender's list and lets the sender try it.
func (n *net) startFlow(fi int32) {
	f := &n.flows[fi]
	f.started = true
	if f.cc == nil && n.work != nil {
		n.work.attach(n, f)
	}
	n.nodes[f.src].flows = append(n.nodes[f.src].flows, fi)
	n.hostTry(f.src)
}

// afterCC (re)arms the flow's controller timer when its deadline moved
// and, with Options.Retime, applies a rate change to the pacer's pending
// gap.
func (n *net) afterCC(f *flow) {
	if n.retime {
		if r := f.cc.Rate(); r != f.rate {
			f.pacer.Retime(n.now, f.rate, r, n.pktSize)
			f.rate = r
		}
	}
	if d := f.cc.Deadline(); d != f.ccAt {
		f.ccAt = d
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
	size := int64(pk.size)
	p.qBytes -= size
	n.nodes[p.node].qBytes -= size
	if pk.inPort >= 0 {
		n.ingressRelease(pk.inPort, size)
		pk.inPort = -1
	}
	if p.markAt == MarkDequeue && n.mark(p, p.qBytes) {
		pk.ce = true
	}
	if n.intStride > 0 && int(pk.nint) < n.intStride {
		// HPCC's switch: the record is pushed as the packet leaves, with
		// the bytes sent before it and the queue it leaves behind.
		n.ints[int(i)*n.intStride+int(pk.nint)] = congestion.INTHop{Rate: p.rate, TS: n.now, TxBytes: p.txBytes, QLen: p.qBytes}
		pk.nint++
	}
	p.txBytes += size
	p.txData++
	if p.monitored && n.now >= n.window[0] && n.now < n.window[1] {
		p.txBytesWindow += size
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

// egress picks switch sw's port towards dst for a packet of ECMP hash h.
func (n *net) egress(sw, dst int32, h uint32) int32 {
	r := n.nodes[sw].route[dst]
	if r.cnt == 1 {
		return n.nh[r.off]
	}
	// Mix the flow's hash with the switch, so that each stage of a Clos
	// splits flows independently (as per-switch ECMP seeds do).
	x := h ^ uint32(sw)*0x9e3779b1
	x ^= x >> 16
	x *= 0x7feb352d
	x ^= x >> 15
	x *= 0x846ca68b
	x ^= x >> 16
	return n.nh[r.off+int32(uint64(x)*uint64(r.cnt)>>32)]
}

// arrive delivers packet i to node ni, which received it on port in.
func (n *net) arrive(ni, i, in int32) {
	nd := &n.nodes[ni]
	pk := &n.pkts[i]
	if nd.kind == hostNode {
		n.deliver(i)
		return
	}
	out := n.egress(ni, pk.dst, pk.hash)
	p := &n.ports[out]
	if pk.kind != pktData {
		n.enqueue(&p.hi, i)
		p.hiByte += int64(pk.size)
		n.kick(out)
		return
	}
	size := int64(pk.size)
	if p.qBytes+size > p.limit || (nd.bufLimit > 0 && nd.qBytes+size > nd.bufLimit) {
		p.drops++
		n.release(i)
		return
	}
	if pk.hops < math.MaxUint8 {
		pk.hops++
	}
	p.qBytes += size
	nd.qBytes += size
	p.maxQ = max(p.maxQ, p.qBytes)
	if p.markAt == MarkEnqueue && n.mark(p, p.qBytes) {
		pk.ce = true
	}
	pk.inPort = in
	n.ingressHold(in, size)
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
// (which may answer with a CNP) and its ACK, a CNP feeds the sender's RP,
// an ACK the sender's controller.
func (n *net) deliver(i int32) {
	pk := &n.pkts[i]
	f := &n.flows[pk.flow]
	switch pk.kind {
	case pktData:
		f.rcvd += int64(pk.payload)
		if n.bins {
			n.binBytes(f, int64(pk.size))
		}
		last := f.size > 0 && f.rcvd >= f.size
		if last && f.finish < 0 {
			f.finish = n.now
		}
		ce := pk.ce
		if n.acks {
			f.unackPkts++
			f.unackWire += int64(pk.size)
			f.unackPay += int64(pk.payload)
			if f.unackPkts >= n.ackInterval || last {
				n.sendAck(f, i)
			} else {
				n.release(i)
			}
		} else {
			n.release(i)
		}
		if f.rp != nil {
			if f.np.OnPacket(n.now, ce) {
				n.sendCNP(f)
			}
			n.afterNP(f)
		}
	case pktCNP:
		n.release(i)
		f.cnpRcvd++
		if f.cc == nil {
			return
		}
		f.cc.OnCNP(n.now)
		n.afterCC(f)
		n.hostTry(f.src)
	case pktAck:
		f.acked += int64(pk.acked)
		f.ackedPay += int64(pk.payload)
		if f.cc != nil {
			var rec []congestion.INTHop
			if n.intStride > 0 {
				o := int(i) * n.intStride
				rec = n.ints[o : o+int(pk.nint)]
			}
			f.cc.OnAck(n.now, congestion.Ack{Bytes: int(pk.acked), ECNEcho: pk.ce,
				RTT: n.now.Sub(pk.sentAt), Hops: int(pk.hops), INT: rec})
			n.afterCC(f)
		}
		n.release(i)
		if f.size > 0 && f.ackedPay >= f.size {
			if f.done < 0 {
				f.done = n.now
				if n.work != nil {
					n.work.finished(n, f)
				}
			}
			return
		}
		n.hostTry(f.src)
	}
}

func (n *net) binBytes(f *flow, b int64) {
	k := int(n.now / n.binWidth)
	for len(f.bins) <= k {
		f.bins = append(f.bins, 0)
	}
	f.bins[k] += b
	if n.traceWidth != n.binWidth {
		k := int(n.now / n.traceWidth)
		for len(f.tbins) <= k {
			f.tbins = append(f.tbins, 0)
		}
		f.tbins[k] += b
	}
}

// sendAck turns data packet i into the ACK for everything f's receiver has
// not acknowledged yet and queues it ahead of the receiver's data.
func (n *net) sendAck(f *flow, i int32) {
	pk := &n.pkts[i]
	pk.kind = pktAck
	pk.acked = int32(f.unackWire)
	pk.payload = int32(f.unackPay)
	pk.size = int32(n.ackSize)
	pk.dst = f.src
	pk.hash = ^f.hash
	pk.inPort = -1
	f.unackPkts, f.unackWire, f.unackPay = 0, 0, 0
	n.queueControl(f.dst, i)
}

// queueControl puts a control packet on host h's strict-priority queue.
func (n *net) queueControl(h, i int32) {
	pi := n.nodes[h].ports[0]
	p := &n.ports[pi]
	n.enqueue(&p.hi, i)
	p.hiByte += int64(n.pkts[i].size)
	n.kick(pi)
}

// sendCNP queues a CNP from the flow's receiver back to its sender, ahead
// of any data on the receiver's NIC.
func (n *net) sendCNP(f *flow) {
	i := n.alloc()
	n.pkts[i] = packet{flow: int32(f.id), size: CNPSize, kind: pktCNP, dst: f.src, inPort: -1, next: -1, hash: ^f.hash}
	n.queueControl(f.dst, i)
}

// hostTry lets a host's NIC send its next packet if the link is free: a
// queued CNP or ACK first, then the data flow whose pacer allows the
// earliest departure among those its window lets send (round-robin among
// ties, like HPCC's QP scheduler). If no flow may send yet, it sets a
// wake-up for the earliest pacer time; a flow held by its window waits for
// an ACK.
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
	windowed := n.alg.windowed
	best, bestAt := -1, clock.Never
	for k := range nd.flows {
		j := (nd.rr + k) % len(nd.flows)
		f := &n.flows[nd.flows[j]]
		if windowed && f.wire-f.acked >= f.cc.Window() {
			continue
		}
		if at := f.pacer.Next(n.now, f.cc.Rate(), n.pktSize); at < bestAt {
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
	fi := nd.flows[best]
	f := &n.flows[fi]
	pay := int64(n.payload)
	if f.size > 0 {
		pay = min(pay, f.size-f.sent)
	}
	wire := pay + int64(n.pktSize-n.payload)
	f.pacer.Sent(n.now, f.cc.Rate(), int(wire))
	f.sent += pay
	f.wire += wire
	f.cc.OnPacketSent(n.now, int(wire))
	n.afterCC(f)
	i := n.alloc()
	n.pkts[i] = packet{sentAt: n.now, flow: fi, size: int32(wire), payload: int32(pay), kind: pktData,
		dst: f.dst, inPort: -1, next: -1, hash: f.hash}
	p.txData++
	n.startTx(pi, i)
	if f.size > 0 && f.sent >= f.size {
		// All sent: the flow leaves the host's list (its ACKs still come).
		nd.flows = append(nd.flows[:best], nd.flows[best+1:]...)
		if best < nd.rr {
			nd.rr--
		}
	}
}
