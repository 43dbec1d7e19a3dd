package proto

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/ib"
)

// A STATS reply, header included, fits one control message, and survives
// an encode/decode round trip; a body of the wrong size is refused.
func TestStatsMessages(t *testing.T) {
	if n := HeaderSize + binary.Size(&StatsResp{}); n > MaxMessage {
		t.Fatalf("StatsResp message of %d bytes exceeds %d: lower MaxStatsQPs", n, MaxMessage)
	}
	var r StatsResp
	copy(r.Name[:], "veth0")
	r.Valid = ValidAll
	r.Device[CtrRxPackets], r.Device[NumDeviceCounters-1] = 5, 6
	r.Listed, r.More = 2, 1
	r.QPs[1] = QPStats{QPN: 0xabcdef, Type: ib.UC, State: ib.RTS, Valid: 3}
	r.QPs[1].Values[NumQPCounters-1] = 7
	msg, err := Encode(nil, Header{Op: OpStats, Seq: 9}, &r)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := DecodeHeader(msg)
	if err != nil || h.Op != OpStats || h.Op.String() != "STATS" {
		t.Fatalf("header %+v %v", h, err)
	}
	var got StatsResp
	if err := DecodeBody(body, &got); err != nil || got != r {
		t.Fatalf("round trip: %v", err)
	}
	if err := DecodeBody(body[:len(body)-1], &got); err == nil {
		t.Fatal("short body accepted")
	}
	var req StatsReq
	if err := DecodeBody(make([]byte, 15), &req); err == nil {
		t.Fatal("short StatsReq accepted")
	}
}

// ValidXDP covers exactly the XDP program and AF_XDP counters.
func TestValidXDP(t *testing.T) {
	for i, d := range DeviceCounters {
		xdp := strings.HasPrefix(d.Name, "xdp_") || strings.HasPrefix(d.Name, "xsk_")
		if got := ValidXDP&(1<<i) != 0; got != xdp {
			t.Errorf("%s: in ValidXDP %v", d.Name, got)
		}
	}
	if NumDeviceCounters > 64 || NumQPCounters > 64 {
		t.Fatal("valid masks too narrow for the counter tables")
	}
}
