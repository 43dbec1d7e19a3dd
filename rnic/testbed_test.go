package rnic

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/transport/ud"
	"github.com/softrnic/softrnic/verbs"
)

// node is one device on the test link with its engine buffers.
type node struct {
	dev  *Device
	port *memlink.Port
	pd   *PD
	rx   [][]byte
	out  [][]byte
}

// testbed is two devices joined by a memlink in virtual time, both driven
// from the test goroutine so that every run with a seed is identical.
type testbed struct {
	t       testing.TB
	clk     *memlink.VirtualClock
	a, b    *node
	bytes   int64 // bytes sent on the wire, both ways
	timeout uint8 // local ACK timeout of connected QPs (default 6, 262 µs)
	// recovery is the loss recovery connect gives RC QPs (default: the
	// device's).
	recovery ib.Recovery
}

var (
	addrA = netip.MustParseAddr("10.77.0.10")
	addrB = netip.MustParseAddr("10.77.0.11")
	macA  = [6]byte{2, 0, 0, 0, 0, 0xa}
	macB  = [6]byte{2, 0, 0, 0, 0, 0xb}
)

func newTestbed(t testing.TB, imp memlink.Impairments, seed uint64, mtu int, addrs ...netip.Addr) *testbed {
	tb := &testbed{t: t, clk: &memlink.VirtualClock{}}
	imp.Delay = 2 * time.Microsecond
	if imp.CorruptSkip == 0 {
		imp.CorruptSkip = 14
	}
	pa, pb := memlink.NewPair(memlink.Config{Impairments: imp, Seed: seed, Clock: tb.clk.Now, Frames: 4096})
	a, b := addrA, addrB
	if len(addrs) == 2 {
		a, b = addrs[0], addrs[1]
	}
	tb.a = newNode(t, pa, macA, a, mtu)
	tb.b = newNode(t, pb, macB, b, mtu)
	return tb
}

func newNode(t testing.TB, p *memlink.Port, mac [6]byte, addr netip.Addr, mtu int) *node {
	d, err := NewDevice(Config{MAC: mac, Addrs: []netip.Addr{addr}, PortMTU: mtu})
	if err != nil {
		t.Fatal(err)
	}
	return &node{dev: d, port: p, pd: d.allocPD(), rx: make([][]byte, 64), out: make([][]byte, 64)}
}

// transmit builds up to a batch of n's frames in buffers its port lends,
// as the engine does, and sends them; it returns how many and their bytes.
func (n *node) transmit(t testing.TB, now clock.Time) (frames int, bytes int64) {
	k := n.port.Lend(n.out)
	m := n.dev.Transmit(now, n.out[:k])
	for _, f := range n.out[:m] {
		bytes += int64(len(f))
	}
	for i := m; i < k; i++ {
		n.out[i] = n.out[i][:0] // not used: back unsent
	}
	if sent, err := n.port.Submit(n.out[:k]); err != nil || sent != k {
		t.Fatalf("port submit %d/%d: %v", sent, k, err)
	}
	clear(n.out[:k])
	return m, bytes
}

// step runs both engines once at the current virtual time and reports
// whether anything moved.
func (tb *testbed) step() bool {
	now := tb.clk.Now()
	moved := false
	for _, n := range []*node{tb.a, tb.b} {
		k, err := n.port.Recv(n.rx, 0)
		if err != nil {
			tb.t.Fatal(err)
		}
		if k > 0 {
			n.dev.Receive(now, n.rx[:k])
			moved = true
		}
		n.dev.Expire(now)
		if k, b := n.transmit(tb.t, now); k > 0 {
			tb.bytes += b
			moved = true
		}
	}
	return moved
}

// linkNS is the serialisation time of the bytes sent so far on a 10 Gb/s
// link, which is how virtual time advances while frames flow.
const nsPerByte = 0.8

// run steps the testbed until done returns true, failing if nothing can
// happen any more or virtual time passes limit.
func (tb *testbed) run(done func() bool, limit time.Duration) {
	tb.t.Helper()
	end := tb.clk.Now().Add(limit)
	for !done() {
		before := tb.bytes
		if tb.step() {
			if d := tb.bytes - before; d > 0 {
				tb.clk.Advance(time.Duration(float64(d) * nsPerByte))
			}
			continue
		}
		next := clock.Min(clock.Min(tb.a.port.NextDelivery(), tb.b.port.NextDelivery()),
			clock.Min(tb.a.dev.NextDeadline(), tb.b.dev.NextDeadline()))
		if next == clock.Never {
			if done() { // a timer that fired in this step completed the work
				return
			}
			tb.t.Fatalf("stalled at %v: nothing in flight, no timer", tb.clk.Now())
		}
		if next <= tb.clk.Now() {
			next = tb.clk.Now() + 1
		}
		tb.clk.Set(next)
		if tb.clk.Now() > end {
			tb.t.Fatalf("virtual time limit %v passed", limit)
		}
	}
}

// connect creates a connected QP pair of type t between the two nodes.
func (tb *testbed) connect(t ib.QPType, mtu int, access ib.Access, depth int) (qa, qb *QP) {
	tb.t.Helper()
	mk := func(n *node) *QP {
		cq := n.dev.newCQ(4 * depth)
		q, err := n.pd.newQP(testQP{Type: t, SendCQ: cq, RecvCQ: n.dev.newCQ(4 * depth), MaxSendWR: depth, MaxRecvWR: depth, MaxSGE: 4, MaxInline: 64,
			Recovery: tb.recovery})
		if err != nil {
			tb.t.Fatal(err)
		}
		return q
	}
	qa, qb = mk(tb.a), mk(tb.b)
	conn := func(q, peer *QP, av ib.AddressVector, psnOut, psnIn uint32) {
		must(tb.t, ibtest.Modify(q, ib.Init, &ib.QPAttr{Access: access}))
		must(tb.t, ibtest.Modify(q, ib.RTR, &ib.QPAttr{PathMTU: uint32(mtu), DestQPN: peer.QPN(), RQPSN: psnIn, MaxDestRdAtomic: 16, MinRNRTimer: 1, AV: av}))
		to := tb.timeout
		if to == 0 {
			to = 6
		}
		must(tb.t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{SQPSN: psnOut, Timeout: to, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16}))
	}
	pa, pb := uint32(0xFFFFF0+qa.QPN()), uint32(0x123456+qb.QPN())
	conn(qa, qb, ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(tb.b.dev.cfg.Addrs[0])}, pa, pb)
	conn(qb, qa, ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(tb.a.dev.cfg.Addrs[0])}, pb, pa)
	return qa, qb
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pollAll drains a CQ into a slice.
func pollAll(cq *CQ) []ib.WC {
	var all []ib.WC
	var buf [64]ib.WC
	for {
		n := cq.Poll(buf[:])
		if n == 0 {
			return all
		}
		all = append(all, buf[:n]...)
	}
}

// rcQP and udQP are q's transport, for tests that look inside it.
func (q *QP) rcQP() *rc.QP { return q.tr.(*rc.QP) }
func (q *QP) udQP() *ud.QP { return q.tr.(*ud.QP) }

// testQP is how the tests describe a QP to create (verbs.QPInitAttr with
// this device's objects and one SGE count).
type testQP struct {
	Type                 ib.QPType
	SendCQ, RecvCQ       *CQ
	SRQ                  *SRQ
	MaxSendWR, MaxRecvWR int
	MaxSGE, MaxInline    int
	SigAll               bool
	Recovery             ib.Recovery
}

// newQP is CreateQP for the tests.
func (pd *PD) newQP(a testQP) (*QP, error) {
	attr := &verbs.QPInitAttr{Type: a.Type, SendCQ: a.SendCQ, RecvCQ: a.RecvCQ, SigAll: a.SigAll, Recovery: a.Recovery,
		Cap: ib.QPCaps{MaxSendWR: uint32(a.MaxSendWR), MaxRecvWR: uint32(a.MaxRecvWR), MaxSendSGE: uint32(a.MaxSGE),
			MaxRecvSGE: uint32(a.MaxSGE), MaxInline: uint32(a.MaxInline)}}
	if a.SRQ != nil {
		attr.SRQ = a.SRQ
	}
	q, err := pd.CreateQP(attr)
	if err != nil {
		return nil, err
	}
	return q.(*QP), nil
}

// allocPD, newCQ, newAH and newSRQ are AllocPD, CreateCQ, CreateAH and
// CreateSRQ for the tests, which use the objects' own types.
func (d *Device) allocPD() *PD {
	pd, _ := d.AllocPD()
	return pd.(*PD)
}

func (d *Device) newCQ(depth int) *CQ {
	cq, err := d.CreateCQ(depth)
	if err != nil {
		panic(err)
	}
	return cq.(*CQ)
}

func (pd *PD) newAH(av ib.AddressVector) (*AH, error) {
	ah, err := pd.CreateAH(&av)
	if err != nil {
		return nil, err
	}
	return ah.(*AH), nil
}

func (pd *PD) newSRQ(maxWR, maxSGE int) (*SRQ, error) {
	s, err := pd.CreateSRQ(maxWR, maxSGE)
	if err != nil {
		return nil, err
	}
	return s.(*SRQ), nil
}
