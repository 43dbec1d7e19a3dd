package swift

// Wiring into the RC transport (per QP, all calls with the engine's
// clock.Now(); none allocate, lock or read a clock):
//
//	// At QP creation (RTR): cc, _ := swift.New(swift.Default(mss, lineRate, baseRTT, target, hop, fsRange))
//	// with mss the wire bytes of a full packet (the unit of cwnd).
//
//	// Before sending a data packet (first transmission or retransmission):
//	if inflight >= cc.Window() { /* wait for an ACK */ }
//	if ok, at := pacer.Allow(now, cc.Rate(), n); !ok { /* park until at */ }
//	cc.OnPacketSent(now, n)                       // n: wire bytes
//	sentAt[psn%window] = now                       // for the RTT sample
//
//	// On an ACK (or a READ response, which acknowledges) that moves snd_una:
//	cc.OnAck(now, congestion.Ack{
//		Bytes: wire bytes of the packets newly acknowledged,
//		RTT:   now − sentAt of the newest newly acknowledged PSN, 0 if it was
//		       retransmitted (Karn: its sample is ambiguous),
//		HostDelay: the peer's ACK turnaround if known (RoCE carries none: 0),
//		Hops: switches on the path if known (RoCE's ACK does not echo the
//		      TTL: 0, or the fabric's hop count from configuration),
//	})
//
//	// On a NAK-sequence-error retransmission: cc.OnRetransmit(now, false)
//	// On the retransmission timer's expiry:  cc.OnRetransmit(now, true)
//
// Deadline is always clock.Never: Swift has no timer of its own; below one
// packet of window Rate paces the QP at cwnd·mss per smoothed RTT.
