package dcqcn

// Wiring into the engine (per QP, all calls with the engine's clock.Now()):
//
//	type qpCC struct {
//		rp    dcqcn.RP         // sender side: rate
//		pacer congestion.Pacer // sender side: departure times
//		np    dcqcn.NP         // receiver side: CNP decisions
//	}
//
//	// At QP creation (profile chosen per device):
//	cfg, npCfg := dcqcn.Paper(lineRate), dcqcn.PaperNP()
//	// or cx := dcqcn.DefaultConnectX(); cx.Set("rpg_ai_rate", 10); cfg, npCfg := cx.Config(lineRate), cx.NPConfig()
//	err := q.rp.Init(cfg); q.np.Init(npCfg)
//
//	// Before sending a data packet of n wire bytes:
//	if ok, at := q.pacer.Allow(now, q.rp.Rate(), n); !ok {
//		// park the QP until at
//	}
//	// after it is on the wire:
//	q.rp.OnPacketSent(now, n)
//
//	// On receiving a CNP (BTH opcode 0x81) whose DestQP is this QP:
//	q.rp.OnCNP(now)
//
//	// On receiving a request or a READ response for this QP (ce = IP ECN
//	// field == CE); never an ACK: a CNP slows the packet's sender, and an
//	// ACK is not traffic its RP paces (see transport/rc, npPacket):
//	if q.np.OnPacket(now, ce) {
//		// send a CNP to the QP's remote QPN, DSCP npCfg.DSCP, PCP npCfg.Prio
//	}
//
//	// Timers: the QP's next wake-up is
//	//   min(q.rp.Deadline(), q.np.Deadline(), pacer time of the parked packet)
//	// and at it:
//	q.rp.OnTimer(now)
//	if q.np.OnTimer(now) { /* send a deferred CNP */ }
//
// None of these allocate, take locks or read a clock; a QP's state is owned
// by the engine goroutine that owns the QP. The counters (RPCounters,
// NPCounters) carry the mlx5 hw_counters names for the stats output:
// rp_cnp_handled, rp_cnp_ignored, np_cnp_sent, np_ecn_marked_roce_packets.
