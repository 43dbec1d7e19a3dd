package timely

// Wiring into the RC transport (per QP, with the engine's clock.Now()):
//
//	cc, _ := timely.New(timely.Paper(lineRate))   // or Artifact
//
//	// Before sending a data packet: pacer.Allow(now, cc.Rate(), n); then
//	cc.OnPacketSent(now, n) and remember sentAt[psn%window] = now.
//
//	// On an ACK that moves snd_una:
//	cc.OnAck(now, congestion.Ack{Bytes: newly acknowledged wire bytes,
//		RTT: now − sentAt of the newest newly acknowledged PSN (0 after a
//		retransmission of it)})
//
// TIMELY is purely rate-based (Window is NoWindow), has no timer and
// ignores CNPs; each update event (a segment, or a round trip) reads the
// RTT of the ACK that completes it, so the transport must not coalesce ACK
// processing across a segment boundary without passing each ACK's RTT.
