package rdmacm_test

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
)

// Two devices on an in-memory link, each with its engine and CM agent: a
// server listens on port 7174, a client dials it, sends one message over
// the connected RC QP and disconnects.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	la, lb := memlink.NewPair(memlink.Config{})
	ipS, ipC := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	macS, macC := [6]byte{2, 0, 0, 0, 0, 1}, [6]byte{2, 0, 0, 0, 0, 2}
	// The neighbour table: what ARP would answer.
	resolve := func(_ context.Context, peer netip.Addr) ([6]byte, error) {
		if peer == ipS {
			return macS, nil
		}
		return macC, nil
	}
	start := func(mac [6]byte, ip netip.Addr, p *memlink.Port) *rdmacm.Agent {
		dev, _ := rnic.NewDevice(rnic.Config{MAC: mac, Addrs: []netip.Addr{ip}})
		go engine.Run(ctx, dev, p, engine.Options{})
		a, _ := rdmacm.New(rdmacm.Config{Device: dev, Resolve: resolve})
		return a
	}
	server, client := start(macS, ipS, la), start(macC, ipC, lb)
	defer server.Close()
	defer client.Close()

	// Server: one receive posted before the REP goes out.
	sdev := server.Device()
	spd, scq := sdev.AllocPD(), sdev.CreateCQ(8)
	rbuf, _ := spd.RegMR(make([]byte, 64), ib.LocalWrite)
	ln, _ := server.Listen(7174, 0)
	accepted := make(chan *rdmacm.Conn)
	go func() {
		c, err := ln.Accept(ctx, &rdmacm.ConnParams{PD: spd, SendCQ: scq, RecvCQ: scq,
			Setup: func(q *rnic.QP) error {
				_, err := q.PostRecv(rnic.RecvWR{ID: 1, SG: []ib.SGE{{Addr: rbuf.IOVA(), Length: 64, LKey: rbuf.LKey()}}})
				return err
			}})
		if err != nil {
			fmt.Println("accept:", err)
		}
		accepted <- c
	}()

	// Client: dial, then SEND.
	cdev := client.Device()
	cpd, ccq := cdev.AllocPD(), cdev.CreateCQ(8)
	conn, err := client.Dial(ctx, ipS, 7174, &rdmacm.ConnParams{PD: cpd, SendCQ: ccq, RecvCQ: ccq})
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	sconn := <-accepted
	msg, _ := cpd.RegMR([]byte("hello through the CM"), ib.LocalWrite)
	conn.QP().PostSend(rnic.SendWR{Opcode: ib.Send, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: msg.IOVA(), Length: uint32(msg.Len()), LKey: msg.LKey()}}})
	var wc [1]ib.WC
	scq.Wait(ctx, wc[:])
	fmt.Printf("server got %q from %v\n", rbuf.Bytes()[:wc[0].ByteLen], sconn.Peer())

	conn.Disconnect(ctx)
	<-sconn.Done()
	fmt.Println("server side:", sconn.Err())
	// Output:
	// server got "hello through the CM" from 10.0.0.2
	// server side: rdmacm: connection disconnected
}
