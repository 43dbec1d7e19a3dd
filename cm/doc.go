// Package cm is InfiniBand Communication Management (IBA vol. 1 ch. 12) over
// the GSI QP (QP1), as RoCEv2 peers speak it: the MAD codec for every CM
// message, the rdma_cm IP private-data header, and the passive and active
// connection state machines that set up and tear down RC connections (REQ,
// REP, RTU, REJ, MRA, DREQ, DREP) and resolve UD services (SIDR_REQ,
// SIDR_REP).
//
// Everything here is pure code: MADs and an explicit now (clock.Time) in;
// MADs to send, events for the QP owner and a timer deadline out. No
// sockets, no goroutines, no clock reads. The QP itself belongs to the
// application; cm only says what to program into it (QPAttr) and when, so
// it depends on no verbs type.
//
// # Wiring a Manager to QP1
//
// An rdmacm.Agent owns one Manager per device (the device's GSI QP is the
// agent's) and drives it from its goroutine that polls QP1, and from the
// application's calls, one at a time under its lock:
//
//   - for every UD SEND_ONLY to QP 1 with Q_Key GSIQKey (0x80010000),
//     calls HandleMAD(now, srcIP, payload) with the 256-byte MAD;
//   - calls Tick(now) when now reaches NextDeadline();
//   - after either (and after any API call), calls Drain and first acts on
//     each Event, then transmits each Send as a UD SEND_ONLY to QP 1 at
//     Send.To (P_Key 0xFFFF, Q_Key GSIQKey, source QP 1, 256-byte payload).
//
// The events and what the QP owner does:
//
//	EventConnRequest        take the application's RC QP, INIT → RTR with
//	                        Event.QP (plus its QPN, and as RQPSN the
//	                        Starting PSN it then gives Accept), then Accept
//	                        (or Reject)
//	EventEstablished        → RTR (active side) and → RTS with Event.QP
//	EventConnResponse       (active, ConnectParams.DeferRTU) → RTR and RTS
//	                        with Event.QP, then Establish (sends the RTU)
//	                        or Reject
//	EventDisconnectRequest  → ERR (flush); the DREP has been sent
//	EventDisconnected       → ERR (our DREQ answered or timed out)
//	EventRejected, EventTimeout   the attempt failed (the QP is the
//	                        application's to reset or destroy)
//	EventTimeWaitExit       the QP may be destroyed or reused
//	EventSIDRRequest        answer with SIDRReply (UD QPN, Q_Key)
//	EventSIDRReply, EventSIDRTimeout   result of ResolveService
//
// PSNs follow the Linux CM (see QPAttr): each side sends from the Starting
// PSN of the peer's REQ or REP and receives from that of its own.
//
// If the passive QP receives a packet in RTR before the RTU arrives, the
// engine calls NotifyEstablished.
package cm
