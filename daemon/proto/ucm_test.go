package proto

import (
	"encoding/binary"
	"testing"
)

// The UCM operations are numbered apart from the others, every UCM body
// fits a message with its header, and an event survives the trip through
// Encode and the decoders as the C library reads it.
func TestUCMMessages(t *testing.T) {
	ops := []Op{OpUCMCreateChannel, OpUCMDestroyChannel, OpUCMListen, OpUCMConnect, OpUCMAccept, OpUCMReject,
		OpUCMEstablish, OpUCMNotify, OpUCMDisconnect, OpUCMMigrate, OpUCMDestroyID, OpUCMEvent}
	seen := map[Op]bool{}
	for _, op := range ops {
		if op < opMax || seen[op] {
			t.Errorf("UCM op %d collides", op)
		}
		seen[op] = true
	}
	for _, body := range []any{UCMListenReq{}, UCMConnectReq{}, UCMAcceptReq{}, UCMRejectReq{}, UCMMigrateReq{}, UCMEvent{}} {
		if n := binary.Size(body); n < 0 || HeaderSize+n > MaxMessage || n%4 != 0 {
			t.Errorf("%T: %d bytes", body, n)
		}
	}
	var p UCMConnParam
	if len(p.PrivateData) < UCMAcceptPrivateData || UCMConnectPrivateData > UCMMaxPrivateData ||
		UCMResolvePrivateData > UCMMaxPrivateData || UCMAcceptUDPrivateData > UCMMaxPrivateData {
		t.Error("private data limits exceed the field")
	}
	var r UCMRejectReq
	if len(r.PrivateData) != UCMRejectPrivateData || UCMRejectUDPPrivateData > UCMRejectPrivateData {
		t.Error("reject private data")
	}

	ev := UCMEvent{Event: UCMEventRejected, Status: 28, ID: 7, Listener: 3, LocalPort: 7471, PeerPort: 40000,
		QKey: 0x01234567, PathMTU: 3, ACKTimeout: 19, HopLimit: 64, FlowLabel: 0xfffff, PKey: 0xffff,
		Param: UCMConnParam{QPN: 0x1234, StartingPSN: 0xabcdef, RNRRetryCount: 7, PrivateDataLen: 3}}
	ev.Local[15], ev.Peer[0] = 1, 0xfe
	copy(ev.Param.PrivateData[:], "abc")
	msg, err := Encode(make([]byte, MaxMessage), Header{Op: OpUCMEvent, Version: Version, Seq: 5}, &ev)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := DecodeHeader(msg)
	if err != nil || h.Op != OpUCMEvent || h.Seq != 5 {
		t.Fatalf("header %+v %v", h, err)
	}
	var got UCMEvent
	if err := DecodeBody(body, &got); err != nil || got != ev {
		t.Fatalf("event round trip: %v\n got %+v\nwant %+v", err, got, ev)
	}
	// The C library reads the fields at these offsets (softrnic_proto.h).
	if binary.LittleEndian.Uint32(body[8:]) != 7 || binary.LittleEndian.Uint16(body[48:]) != 7471 ||
		binary.LittleEndian.Uint32(body[72:]) != 0x1234 || string(body[72+16:72+19]) != "abc" {
		t.Fatalf("event layout: % x", body[:96])
	}
	if DecodeBody(body[:len(body)-1], &got) == nil {
		t.Fatal("a short event decoded")
	}
}
