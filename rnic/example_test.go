package rnic_test

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// Two devices on an in-memory link: an RDMA WRITE from one to the other,
// the way an application and an engine use the package.
func Example() {
	clk := &memlink.VirtualClock{}
	la, lb := memlink.NewPair(memlink.Config{Clock: clk.Now})
	ipA, ipB := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	macA, macB := [6]byte{2, 0, 0, 0, 0, 1}, [6]byte{2, 0, 0, 0, 0, 2}
	a, _ := rnic.NewDevice(rnic.Config{MAC: macA, Addrs: []netip.Addr{ipA}})
	b, _ := rnic.NewDevice(rnic.Config{MAC: macB, Addrs: []netip.Addr{ipB}})

	// Application side, through the verbs interface: PD, MRs, CQ, QP on
	// each device.
	pdA, _ := a.AllocPD()
	pdB, _ := b.AllocPD()
	memA, _ := a.AllocMem(11)
	memB, _ := b.AllocMem(11)
	copy(memA.Bytes(), "hello, RDMA")
	src, _ := pdA.RegMR(memA, 0, 11, 0, ib.LocalWrite)
	dst, _ := pdB.RegMR(memB, 0, 11, 0, ib.LocalWrite|ib.RemoteWrite)
	cqA, _ := a.CreateCQ(16)
	cqB, _ := b.CreateCQ(16)
	caps := ib.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}
	qa, _ := pdA.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cqA, RecvCQ: cqA, Cap: caps})
	qb, _ := pdB.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cqB, RecvCQ: cqB, Cap: caps})
	connect := func(q, peer verbs.QP, mac [6]byte, ip netip.Addr) error {
		return errors.Join(
			q.Modify(&ib.QPAttr{State: ib.Init, Port: 1, Access: ib.RemoteWrite},
				ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags),
			q.Modify(&ib.QPAttr{State: ib.RTR, PathMTU: 1024, DestQPN: peer.QPN(), RQPSN: 100,
				MaxDestRdAtomic: 16, MinRNRTimer: 12, AV: ib.AddressVector{DMAC: mac, DGID: ib.GIDFrom(ip)}},
				ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer),
			q.Modify(&ib.QPAttr{State: ib.RTS, SQPSN: 100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
				ib.AttrState|ib.AttrSQPSN|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|ib.AttrMaxQPRdAtomic))
	}
	if err := errors.Join(connect(qa, qb, macB, ipB), connect(qb, qa, macA, ipA)); err != nil {
		fmt.Println(err)
		return
	}
	_, err := qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG:         []ib.SGE{{Addr: src.IOVA(), Length: uint32(src.Len()), LKey: src.LKey()}},
		RemoteAddr: dst.IOVA(), RKey: dst.RKey()}})
	if err != nil {
		fmt.Println(err)
		return
	}

	// Engine side: move frames between the devices and the link.
	out := make([][]byte, 64)
	in := make([][]byte, 64)
	var wc [1]ib.WC
	for cqA.Poll(wc[:]) == 0 {
		for _, d := range []struct {
			dev  *rnic.Device
			port *memlink.Port
		}{{a, la}, {b, lb}} {
			now := clk.Now()
			n, _ := d.port.Recv(in, 0)
			d.dev.Receive(now, in[:n])
			d.dev.Expire(now)
			// Frames are built in buffers the port lends; the ones not
			// used go back empty.
			k := d.port.Lend(out)
			n = d.dev.Transmit(now, out[:k])
			for i := n; i < k; i++ {
				out[i] = out[i][:0]
			}
			if _, err := d.port.Submit(out[:k]); err != nil {
				panic(err)
			}
		}
		next := min(la.NextDelivery(), lb.NextDelivery(), a.NextDeadline(), b.NextDeadline())
		if next != clock.Never && next > clk.Now() {
			clk.Set(next)
		}
	}
	fmt.Println(wc[0].Status, string(memB.Bytes()))
	// Output: SUCCESS hello, RDMA
}
