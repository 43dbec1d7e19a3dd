package proto

import (
	"encoding/binary"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// SIDRStatus reads back the status SIDRMsg put in an ECONNREFUSED reply,
// and nothing from any other error (a REJ reason is not a SIDR status).
func TestSIDRStatus(t *testing.T) {
	for _, s := range []uint8{0, 1, 2, 5, 255} {
		err := fmt.Errorf("resolve: %w", &Error{Op: OpCMConnect, Errno: unix.ECONNREFUSED, Msg: SIDRMsg(s, "rdmacm: service lookup refused")})
		got, ok := SIDRStatus(err)
		if !ok || got != s {
			t.Errorf("status %d: got %d %v", s, got, ok)
		}
		if _, ok := RejectReason(err); ok {
			t.Errorf("status %d read as a REJ reason", s)
		}
	}
	for _, err := range []error{
		nil,
		fmt.Errorf("plain"),
		&Error{Op: OpCMConnect, Errno: unix.ETIMEDOUT, Msg: SIDRMsg(1, "x")}, // not a refusal
		&Error{Op: OpCMConnect, Errno: unix.ECONNREFUSED, Msg: RejectMsg(8, "x")},
		&Error{Op: OpCMConnect, Errno: unix.ECONNREFUSED, Msg: "SIDR status 256: x"},
		&Error{Op: OpCMConnect, Errno: unix.ECONNREFUSED, Msg: "SIDR status 1"},
	} {
		if s, ok := SIDRStatus(err); ok {
			t.Errorf("%v: status %d", err, s)
		}
	}
}

// The daemon tells the UDP port space's CM_ACCEPT and CM_CONNECT bodies
// from CMConnReq by size alone: the three must differ.
func TestCMBodySizesDistinct(t *testing.T) {
	conn, acc, res := binary.Size(CMConnReq{}), binary.Size(CMUDAcceptReq{}), binary.Size(CMResolveReq{})
	if conn == acc || conn == res || acc <= 0 || res <= 0 {
		t.Fatalf("CMConnReq %d, CMUDAcceptReq %d, CMResolveReq %d bytes: must differ", conn, acc, res)
	}
}
