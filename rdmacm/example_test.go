package rdmacm_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// Two devices on an in-memory link, each with its engine and CM agent: a
// server listens on port 7174, a client connects to it, sends one message
// over the connected RC QP and disconnects. As with librdmacm, each side
// creates its QP first and names it to the CM; the code uses only verbs
// and rdmacm.CM, so it runs as it is through a daemon (package client).
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	la, lb := memlink.NewPair(memlink.Config{})
	ipS, ipC := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	macS, macC := [6]byte{2, 0, 0, 0, 0, 1}, [6]byte{2, 0, 0, 0, 0, 2}
	// The neighbour table: what ARP would answer.
	resolve := func(_ context.Context, peer netip.Addr) ([6]byte, error) {
		switch peer {
		case ipS:
			return macS, nil
		case ipC:
			return macC, nil
		}
		return [6]byte{}, errors.New("no neighbour")
	}
	start := func(mac [6]byte, ip netip.Addr, p *memlink.Port) (verbs.Device, *rdmacm.Agent) {
		dev, _ := rnic.NewDevice(rnic.Config{MAC: mac, Addrs: []netip.Addr{ip}, Resolve: resolve})
		go func() { _ = engine.Run(ctx, dev, p, engine.Options{}) }() // until ctx ends
		a, _ := rdmacm.New(rdmacm.Config{Device: dev, Resolve: resolve})
		return dev, a
	}
	sdev, server := start(macS, ipS, la)
	cdev, client := start(macC, ipC, lb)
	defer server.Close()
	defer client.Close()
	newQP := func(dev verbs.Device) (verbs.PD, verbs.CQ, verbs.QP) {
		pd, _ := dev.AllocPD()
		cq, _ := dev.CreateCQ(8)
		qp, _ := pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
			Cap: ib.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		return pd, cq, qp
	}
	var p rdmacm.ConnParam

	// Server: one receive posted (in INIT) before the REP goes out.
	spd, scq, sqp := newQP(sdev)
	smem, _ := sdev.AllocMem(64)
	rbuf, _ := spd.RegMR(smem, 0, 64, 0, ib.LocalWrite)
	if err := rdmacm.InitQP(sqp, &p); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := sqp.PostRecv([]verbs.RecvWR{{ID: 1, SG: []ib.SGE{{Addr: rbuf.IOVA(), Length: 64, LKey: rbuf.LKey()}}}}); err != nil {
		fmt.Println(err)
		return
	}
	var cm rdmacm.CM = server
	ln, _ := cm.Listen(7174, 0)
	accepted := make(chan rdmacm.Conn)
	go func() {
		r, err := ln.GetRequest(ctx)
		if err != nil {
			fmt.Println("listen:", err)
			return
		}
		c, err := r.Accept(ctx, sqp, &p)
		if err != nil {
			fmt.Println("accept:", err)
		}
		accepted <- c
	}()

	// Client: connect, then SEND.
	cpd, _, cqp := newQP(cdev)
	conn, err := client.Connect(ctx, cqp, ipS, 7174, &p)
	if err != nil {
		fmt.Println("connect:", err)
		return
	}
	sconn := <-accepted
	cmem, _ := cdev.AllocMem(64)
	n := copy(cmem.Bytes(), "hello through the CM")
	msg, _ := cpd.RegMR(cmem, 0, 64, 0, ib.LocalWrite)
	_, err = conn.QP().PostSend([]verbs.SendWR{{Opcode: ib.Send, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: msg.IOVA(), Length: uint32(n), LKey: msg.LKey()}}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	var wc [1]ib.WC
	for scq.Poll(wc[:]) == 0 {
		if err := scq.Wait(time.Second); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Printf("server got %q from %v\n", smem.Bytes()[:wc[0].ByteLen], sconn.Peer())

	if err := conn.Disconnect(ctx); err != nil {
		fmt.Println(err)
	}
	<-sconn.Done()
	fmt.Println("server side:", sconn.Err())
	// Output:
	// server got "hello through the CM" from 10.0.0.2
	// server side: rdmacm: connection disconnected
}
