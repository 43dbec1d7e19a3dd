// Package checker is the packet-assertion vocabulary the tests of the
// transports, the device, the CM and the daemon share, as gVisor's
// pkg/tcpip/checker is its stack's: decode a RoCEv2 packet (or a whole
// frame) and check it against a list of Checks, each one property a
// packet must have.
//
// A transport test looks at transport packets, the BTH and what follows it
// up to the ICRC, as transports build and receive them:
//
//	checker.Transport(t, b, checker.Opcode(bth.RCAcknowledge), checker.AETH(rc.SynACK, 1))
//
// and at sequences, which Packets compares with what each packet must be,
// printing the whole sequence when one differs:
//
//	checker.Packets(t, got, checker.Is(checker.Opcode(op), checker.PSN(100)), ...)
//
// A device, engine or daemon test looks at frames: Frame parses one,
// checks its ICRC, its addresses and ECN (FrameChecks), and its transport
// packet with the same Checks.
//
// A failed check reports what the packet was: the Check functions return
// an error describing the mismatch, and the assertion functions fail the
// test with it.
package checker
