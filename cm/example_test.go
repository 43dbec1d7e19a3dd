package cm_test

import (
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/cm"
)

// A passive side (as for `rping -c -a <us>`) and an active side in one
// process: every MAD one Manager sends is handed to the other, and each
// event is acted on as the engine would.
func Example() {
	server := cm.New(cm.Config{CAGUID: 0x0200_00ff_fe00_0002, Seed: 2})
	client := cm.New(cm.Config{CAGUID: 0x0200_00ff_fe00_0001, Seed: 1})
	srvIP, cliIP := netip.MustParseAddr("10.77.0.11"), netip.MustParseAddr("10.77.0.10")
	if err := server.Listen(cm.ServiceIDTCP(7174), cm.ListenOptions{RDMACM: true}); err != nil {
		fmt.Println(err)
		return
	}

	var now clock.Time
	_, err := client.Connect(now, &cm.ConnectParams{Peer: srvIP, Local: cliIP, ServiceID: cm.ServiceIDTCP(7174),
		QPN: 0x11, StartingPSN: 0x1234, PathMTU: 3, ResponderResources: 1, InitiatorDepth: 1,
		RetryCount: 7, RNRRetry: 7, RDMACM: true, SrcPort: 50000})
	if err != nil {
		fmt.Println(err)
		return
	}

	pump := func(from, to *cm.Manager, fromIP netip.Addr, who string) bool {
		events, sends := from.Drain()
		for _, e := range events {
			fmt.Printf("%s: %v remote QPN %#x, send PSN %#x, receive PSN %#x\n",
				who, e.Kind, e.QP.RemoteQPN, e.QP.SQPSN, e.QP.RQPSN)
			if e.Kind == cm.EventConnRequest {
				// Here: create the QP and move it to RTR with e.QP and
				// the receive PSN the REP will carry (0x5678).
				err := from.Accept(now, e.ID, &cm.AcceptParams{QPN: 0x22, StartingPSN: 0x5678,
					ResponderResources: 1, InitiatorDepth: 1, RNRRetry: 7})
				if err != nil {
					fmt.Println(err)
				}
			}
		}
		for _, s := range sends {
			if err := to.HandleMAD(now, fromIP, s.MAD[:]); err != nil {
				fmt.Println(err)
			}
		}
		return len(events)+len(sends) > 0
	}
	for pump(client, server, cliIP, "client") || pump(server, client, srvIP, "server") {
	}
	// Output:
	// server: CONN_REQUEST remote QPN 0x11, send PSN 0x1234, receive PSN 0x0
	// client: ESTABLISHED remote QPN 0x22, send PSN 0x5678, receive PSN 0x1234
	// server: ESTABLISHED remote QPN 0x11, send PSN 0x1234, receive PSN 0x5678
}
