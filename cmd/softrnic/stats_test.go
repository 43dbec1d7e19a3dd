package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
)

func sampleStats() *statsReport {
	r := &statsReport{Device: "veth0", Valid: proto.ValidAll &^ proto.ValidXDP}
	r.Values[proto.CtrRxPackets] = 123
	r.Values[proto.CtrTxPackets] = 45
	r.Values[proto.CtrXDPSteered] = 9 // not valid on this port: never printed
	r.Daemon[proto.DCtrLimitRefusals] = 4
	q := proto.QPStats{QPN: 17, Type: ib.RC, State: ib.RTS, Valid: 1<<proto.QCtrDuplicateRequest | 1<<proto.QCtrRetransmits}
	q.Values[proto.QCtrDuplicateRequest] = 3
	q.Values[proto.QCtrRetransmits] = 2
	u := proto.QPStats{QPN: 18, Type: ib.UD, State: ib.RTS, Valid: 1 << proto.QCtrRxPackets}
	u.Values[proto.QCtrRxPackets] = 8
	r.QPs = []proto.QPStats{q, u}
	return r
}

// With an AF_XDP port over several queues, one line (one JSON object) per
// receive queue follows the device's; --qp leaves them out.
func TestStatsQueues(t *testing.T) {
	r := sampleStats()
	r.NumQueues = 2
	r.Queues = []proto.QueueStats{{RxPackets: 10, RxRingFull: 1}, {RxPackets: 20}}
	var b bytes.Buffer
	if err := writeStatsText(&b, r, false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 6 || lines[1] != "link veth0/1 queue 0 rx_packets 10 xsk_rx_ring_full 1" ||
		lines[2] != "link veth0/1 queue 1 rx_packets 20 xsk_rx_ring_full 0" || !strings.HasPrefix(lines[3], "daemon veth0 ") ||
		!strings.HasPrefix(lines[4], "link veth0/1 lqpn 17 ") {
		t.Errorf("text:\n%s", b.String())
	}
	b.Reset()
	if err := writeStatsText(&b, r, true); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "queue") {
		t.Errorf("--qp output shows queues: %s", b.String())
	}
	b.Reset()
	if err := writeStatsJSON(&b, r, false); err != nil {
		t.Fatal(err)
	}
	var got statsJSON
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.NumQueues != 2 || len(got.Queues) != 2 || got.Queues[1] != (statsJSONQueue{Queue: 1, RxPackets: 20}) || got.Queues[0].RxRingFull != 1 {
		t.Errorf("JSON queues: %d %+v", got.NumQueues, got.Queues)
	}
	b.Reset()
	if err := writeStatsJSON(&b, sampleStats(), false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "queue") {
		t.Errorf("JSON without queues mentions them:\n%s", b.String())
	}
}

func TestStatsText(t *testing.T) {
	var b bytes.Buffer
	if err := writeStatsText(&b, sampleStats(), false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines:\n%s", len(lines), b.String())
	}
	if !strings.HasPrefix(lines[0], "link veth0/1 rx_packets 123 tx_packets 45 rx_bytes 0 tx_bytes 0 duplicate_request 0 ") {
		t.Errorf("device line: %s", lines[0])
	}
	if strings.Contains(lines[0], "xdp_") || strings.Contains(lines[0], "xsk_") {
		t.Errorf("device line shows counters not counted on this port: %s", lines[0])
	}
	// Every field after "link DEV/1" is a name-value pair.
	f := strings.Fields(lines[0])[2:]
	if len(f)%2 != 0 || len(f)/2 != int(proto.NumDeviceCounters)-12 { // less 5 XDP program and 7 AF_XDP counters
		t.Errorf("device line has %d fields", len(f))
	}
	// The daemon's own counters, all of them, on a line of their own.
	if f := strings.Fields(lines[1]); len(f) != 2+2*proto.NumDaemonCounters || f[0] != "daemon" ||
		!strings.Contains(lines[1], " limit_refusals 4 ") {
		t.Errorf("daemon line: %s", lines[1])
	}
	if lines[2] != "link veth0/1 lqpn 17 type RC state RTS duplicate_request 3 retransmits 2" {
		t.Errorf("QP line: %s", lines[2])
	}
	if lines[3] != "link veth0/1 lqpn 18 type UD state RTS rx_packets 8" {
		t.Errorf("UD QP line: %s", lines[3])
	}
	b.Reset()
	r := sampleStats()
	r.QPs = r.QPs[:1]
	if err := writeStatsText(&b, r, true); err != nil {
		t.Fatal(err)
	}
	if b.String() != "link veth0/1 lqpn 17 type RC state RTS duplicate_request 3 retransmits 2\n" {
		t.Errorf("--qp output: %q", b.String())
	}
}

func TestStatsJSON(t *testing.T) {
	var b bytes.Buffer
	if err := writeStatsJSON(&b, sampleStats(), false); err != nil {
		t.Fatal(err)
	}
	var got statsJSON
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if got.Ifname != "veth0" || got.Port != 1 || got.Counters["rx_packets"] != 123 || got.Counters["tx_packets"] != 45 {
		t.Errorf("device: %+v", got)
	}
	if got.Daemon["limit_refusals"] != 4 || len(got.Daemon) != proto.NumDaemonCounters {
		t.Errorf("daemon counters: %v", got.Daemon)
	}
	if _, ok := got.Counters["xdp_steered"]; ok {
		t.Error("xdp_steered reported on a port that does not count it")
	}
	if len(got.QPs) != 2 || got.QPs[0].LQPN != 17 || got.QPs[0].Type != "RC" || got.QPs[0].Counters["duplicate_request"] != 3 ||
		len(got.QPs[0].Counters) != 2 || got.QPs[1].Counters["rx_packets"] != 8 {
		t.Errorf("QPs: %+v", got.QPs)
	}
	if len(got.NotCounted) != len(proto.NotCounted) || got.NotCounted[0] != proto.NotCounted[0].Name {
		t.Errorf("not_counted: %v", got.NotCounted)
	}
}

func TestStatusText(t *testing.T) {
	var r statusReport
	copy(r.Info.Name[:], "veth0")
	r.Info.NodeGUID = 0x0211223344556677
	r.Info.PortActive = true
	r.Info.ActiveMTU = 1024
	r.Info.NumGIDs = 1
	r.Info.GIDs[0] = [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 9, 14: 0, 15: 1}
	copy(r.Status.Port.Kind[:], "afxdp")
	copy(r.Status.Port.Attach[:], "generic")
	r.Status.Port.Queues = 1
	r.Status.NumClients, r.Status.Listed = 2, 1
	r.Status.Clients[0] = proto.ClientStatus{ID: 4, PID: 77, QPs: 1, CQs: 1, MRs: 2, PDs: 1}
	r.QPs = []proto.QPStats{{QPN: 17, Type: ib.RC, State: ib.RTS}}
	r.HaveQP = true
	var b bytes.Buffer
	if err := writeStatus(&b, &r); err != nil {
		t.Fatal(err)
	}
	want := `device     veth0  node_guid 0211223344556677  port 1 ACTIVE  mtu 1024
gid 0      10.9.0.1
port       afxdp  XDP generic mode  copy
queues     1
qps        1
  qpn 17  RC  RTS
clients    2 (1 visible to you)
  client 4  pid 77 uid 0 gid 0  qps 1 cqs 1 mrs 2 pds 1
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}
