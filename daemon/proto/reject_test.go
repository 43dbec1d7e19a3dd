package proto

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// RejectReason reads back the reason RejectMsg put in an ECONNREFUSED
// reply, and nothing from any other error.
func TestRejectReason(t *testing.T) {
	for _, r := range []uint16{0, 1, 8, 28, 65535} {
		err := fmt.Errorf("dial: %w", &Error{Op: OpCMConnect, Errno: unix.ECONNREFUSED, Msg: RejectMsg(r, "rdmacm: connection rejected: x (8)")})
		got, ok := RejectReason(err)
		if !ok || got != r {
			t.Errorf("reason %d: got %d %v", r, got, ok)
		}
	}
	for _, err := range []error{
		nil,
		fmt.Errorf("plain"),
		&Error{Op: OpCMConnect, Errno: unix.ETIMEDOUT, Msg: RejectMsg(8, "x")}, // not a refusal
		&Error{Op: OpCMConnect, Errno: unix.ECONNREFUSED, Msg: "refused"},
		&Error{Op: OpCMConnect, Errno: unix.ECONNREFUSED, Msg: "REJ reason 70000: x"},
		&Error{Op: OpCMConnect, Errno: unix.ECONNREFUSED, Msg: "REJ reason 8"},
		&Error{Op: OpCMConnect, Errno: unix.ECONNREFUSED, Msg: "REJ reason -1: x"},
	} {
		if r, ok := RejectReason(err); ok {
			t.Errorf("%v: reason %d", err, r)
		}
	}
}
