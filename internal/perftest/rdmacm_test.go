package perftest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/frame/frametest"
)

// cmEvent is one step of write_bw_rdmacm.pcap as the control channel sees
// it: a control SEND (data) or a CM REQ (the CM handshake of a QP).
type cmEvent struct {
	fromClient bool
	req        bool   // a CM ConnectRequest (MAD attribute 0x0010)
	data       []byte // the SEND's payload
}

// cmControl returns the CM REQs and the SEND_ONLY payloads on the control
// QP of write_bw_rdmacm.pcap, in capture order. The control QP is the
// destination QP of the first RC SEND; the client is the REQ's sender.
func cmControl(t *testing.T) []cmEvent {
	t.Helper()
	f, err := os.Open(filepath.Join(frametest.VectorsDir(t), "write_bw_rdmacm.pcap"))
	if err != nil {
		t.Skipf("reference capture not available: %v", err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var ev []cmEvent
	var client netip.Addr
	ctrlQPN := uint32(0)
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := gopacket.NewPacket(data, r.LinkType(), gopacket.DecodeOptions{Lazy: true, NoCopy: true})
		udp, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		ip4, ok4 := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if !ok || !ok4 || udp.DstPort != 4791 || len(udp.Payload) < 12+4 {
			continue
		}
		src, _ := netip.AddrFromSlice(ip4.SrcIP.To4())
		b := udp.Payload
		op, padCnt, dqpn := b[0], int(b[1]>>4&3), binary.BigEndian.Uint32(b[4:8])&0xffffff
		switch {
		case op == 0x64 && dqpn == 1 && len(b) >= 12+8+24: // UD SEND_ONLY to QP1: a MAD
			mad := b[12+8:]
			if binary.BigEndian.Uint16(mad[16:18]) == 0x0010 {
				if !client.IsValid() {
					client = src
				}
				ev = append(ev, cmEvent{fromClient: src == client, req: true})
			}
		case op == 0x04: // RC SEND_ONLY
			if ctrlQPN == 0 {
				ctrlQPN = dqpn
			}
			if dqpn != ctrlQPN {
				continue
			}
			pl := b[12 : len(b)-4-padCnt]
			ev = append(ev, cmEvent{fromClient: src == client, data: append([]byte(nil), pl...)})
		}
	}
	if len(ev) == 0 {
		t.Fatal("no control messages in write_bw_rdmacm.pcap")
	}
	return ev
}

// scriptChannel plays one side of a recorded control channel: Recv hands
// out the other side's messages in order, Send records ours.
type scriptChannel struct {
	mu   sync.Mutex
	in   [][]byte
	sent [][]byte
}

func (s *scriptChannel) Send(_ context.Context, b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, append([]byte(nil), b...))
	return nil
}

func (s *scriptChannel) Recv(_ context.Context, b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.in) == 0 {
		return 0, io.EOF
	}
	m := s.in[0]
	s.in = s.in[1:]
	if len(m) > len(b) {
		return 0, fmt.Errorf("message of %d bytes", len(m))
	}
	return copy(b, m), nil
}

// cmScripted is a LocalCM whose records and reports are fixed.
type cmScripted struct {
	scriptedLocal
	log []string // "connect" when ConnectQPs ran, after how many of our SENDs
	ch  *scriptChannel
}

func (s *cmScripted) ConnectQPs(n Negotiated) error {
	s.log = append(s.log, fmt.Sprintf("connect after %d sends", len(s.ch.sent)))
	return nil
}

// maskDest zeroes what differs between any two runs in a pingpong_dest:
// QPN, PSN, rkey, vaddr, GID and the GID index (each side's own table);
// and the 4 alignment bytes before vaddr, which perftest never initialises
// (its last record in the capture carries stack bytes there).
func maskDest(b []byte) []byte {
	m := append([]byte(nil), b...)
	clear(m[8:24])
	clear(m[24:48])
	clear(m[52:56])
	return m
}

// TestCMClientMatchesCapture runs our -R client against the server side
// of write_bw_rdmacm.pcap (ib_write_bw -R -s 4096 -n 50 on rxe) and checks
// that every control SEND we make equals stock perftest's byte for byte,
// modulo QPN, PSN, rkey, vaddr, GID and the measured bandwidths; and that
// the test QPs are connected exactly where the capture has its second CM
// handshake.
func TestCMClientMatchesCapture(t *testing.T) {
	ev := cmControl(t)
	var fromServer, fromClient [][]byte
	reqs, connectAt := 0, -1
	for _, e := range ev {
		switch {
		case e.req:
			reqs++
			if reqs == 2 {
				connectAt = len(fromClient)
			}
		case e.fromClient:
			fromClient = append(fromClient, e.data)
		default:
			fromServer = append(fromServer, e.data)
		}
	}
	if reqs != 2 || connectAt < 0 {
		t.Fatalf("capture has %d CM REQs, want 2 (control, test QP)", reqs)
	}
	ch := &scriptChannel{in: fromServer}
	l := &cmScripted{ch: ch}
	// The capture's client record, as our Dests would give it.
	cl, _, err := ParseCMDest(fromClient[len(fromClient)-1])
	if err != nil {
		t.Fatal(err)
	}
	l.dests = []Dest{cl}
	l.report = BWReport{Size: 4096, Iters: 50, PeakBW: 1, AvgBW: 1, MsgRate: 1}
	test := Test{Verb: Write, Measure: BW, Transport: RC, QPs: 1, Size: 4096, SizeGiven: true}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := RunCM(ctx, ch, Config{Test: test, Client: true, MTU: 3, PageSize: 4096, CacheLine: 64}, 1, l)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.in) != 0 {
		t.Errorf("%d of the server's messages left unread", len(ch.in))
	}
	if len(ch.sent) != len(fromClient) {
		t.Fatalf("we sent %d control messages, stock perftest %d", len(ch.sent), len(fromClient))
	}
	if want := fmt.Sprintf("connect after %d sends", connectAt); len(l.log) != 1 || l.log[0] != want {
		t.Errorf("test QPs connected %v, capture: %s", l.log, want)
	}
	for i, got := range ch.sent {
		want := fromClient[i]
		if len(got) == CMDestSize && len(want) == CMDestSize {
			got, want = maskDest(got), maskDest(want)
		}
		if len(got) == 8 && len(want) == 8 && i >= len(fromClient)-1-3 {
			continue // measured bandwidths and message rate
		}
		if !bytes.Equal(got, want) {
			t.Errorf("control SEND %d:\n got  %x\n want %x", i, got, want)
		}
	}
	if out.PeerVersion != "6.06" || out.MTU != 3 || len(out.Remote) != 1 {
		t.Errorf("outcome %+v", out)
	}
	sv, idx, err := ParseCMDest(fromServer[len(fromServer)-1])
	if err != nil || out.Remote[0] != sv || idx != 1 || sv.QPN != 0x1b || sv.Addr() != netip.MustParseAddr("10.77.0.11") {
		t.Errorf("remote %+v (gid index %d, %v), want the capture's server record", out.Remote[0], idx, err)
	}
}

// TestCMServerMatchesCapture is the server side: our -R server against the
// capture's client messages.
func TestCMServerMatchesCapture(t *testing.T) {
	ev := cmControl(t)
	var fromServer, fromClient [][]byte
	for _, e := range ev {
		switch {
		case e.req:
		case e.fromClient:
			fromClient = append(fromClient, e.data)
		default:
			fromServer = append(fromServer, e.data)
		}
	}
	ch := &scriptChannel{in: fromClient}
	l := &cmScripted{ch: ch}
	sv, _, err := ParseCMDest(fromServer[len(fromServer)-1])
	if err != nil {
		t.Fatal(err)
	}
	l.dests = []Dest{sv}
	test := Test{Verb: Write, Measure: BW, Transport: RC, QPs: 1, Size: 4096, SizeGiven: true}
	out, err := RunCM(context.Background(), ch, Config{Test: test, MTU: 3, PageSize: 4096, CacheLine: 64}, 1, l)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.sent) != len(fromServer) {
		t.Fatalf("we sent %d control messages, stock perftest %d", len(ch.sent), len(fromServer))
	}
	for i, got := range ch.sent {
		want := fromServer[i]
		if len(got) == CMDestSize {
			got, want = maskDest(got), maskDest(want)
		}
		if len(got) == 8 {
			continue // perftest's passive server sends an uninitialised report
		}
		if !bytes.Equal(got, want) {
			t.Errorf("control SEND %d:\n got  %x\n want %x", i, got, want)
		}
	}
	if out.PeerReport == nil || out.PeerReport.Size != 4096 || out.PeerReport.Iters != 50 || out.PeerReport.AvgBW <= 0 {
		t.Errorf("peer report %+v", out.PeerReport)
	}
}

func TestCMDestRoundTripAndRejects(t *testing.T) {
	d := Dest{OutReads: 16, QPN: 0xabcdef, PSN: 0x123456, RKey: 0xdeadbeef, VAddr: 0x5633aec3e000,
		GID: GIDFromAddr(netip.MustParseAddr("10.77.0.10")), SRQN: 7}
	for _, size := range []int{CMDestSize, CMDestSizeTail} {
		b := AppendCMDest(nil, d, 3, size)
		if len(b) != size {
			t.Fatalf("%d bytes, want %d", len(b), size)
		}
		got, idx, err := ParseCMDest(b)
		if err != nil || got != d || idx != 3 {
			t.Fatalf("round trip of %d bytes: %+v %d %v", size, got, idx, err)
		}
	}
	b := AppendCMDest(nil, d, 3, CMDestSize)
	bad := append([]byte(nil), b...)
	bad[8] = 1 // QPN wider than 24 bits
	if _, _, err := ParseCMDest(bad); err == nil {
		t.Error("QPN of 25 bits accepted")
	}
	if _, _, err := ParseCMDest(b[:55]); err == nil {
		t.Error("55-byte record accepted")
	}
}

func TestCMRejectsWrongMessageSize(t *testing.T) {
	ch := &scriptChannel{in: [][]byte{[]byte("6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), {0, 0, 0x10}}}
	test := Test{Verb: Write, Measure: BW, Transport: RC, QPs: 1}
	_, err := RunCM(context.Background(), ch, Config{Test: test, Client: true, MTU: 3, PageSize: 4096, CacheLine: 64}, 0, &cmScripted{ch: ch})
	if err == nil {
		t.Fatal("a 3-byte page size message was accepted")
	}
}

func TestParseArgsRDMACM(t *testing.T) {
	p, err := ParseArgs(Write, BW, []string{"-R", "-s", "4096", "host"})
	if err != nil || !p.RDMACM || p.Host != "host" {
		t.Fatalf("%+v %v", p, err)
	}
	if p, err := ParseArgs(Read, BW, []string{"--rdma_cm"}); err != nil || !p.RDMACM {
		t.Fatalf("--rdma_cm: %+v %v", p, err)
	}
	if p, err := ParseArgs(Send, BW, []string{"-R", "-c", "UD"}); err != nil || p.Transport != UD {
		t.Errorf("-R with UD (SIDR): %+v %v", p, err)
	}
	if _, err := ParseArgs(Send, BW, []string{"-R", "-c", "UC"}); err == nil {
		t.Error("-R with UC accepted (rdma_cm has no UC port space)")
	}
}

// TestCMNewerRecordLayout replays the capture's client with its records in
// the layout of perftests whose pingpong_dest has tail_markers_vaddr (64
// bytes, GID 8 bytes further): our server must read them and answer in the
// same layout, since such a peer reads only its own.
func TestCMNewerRecordLayout(t *testing.T) {
	ev := cmControl(t)
	var fromClient [][]byte
	for _, e := range ev {
		if !e.req && e.fromClient {
			m := e.data
			if len(m) == CMDestSize {
				d, idx, err := ParseCMDest(m)
				if err != nil {
					t.Fatal(err)
				}
				m = AppendCMDest(nil, d, idx, CMDestSizeTail)
			}
			fromClient = append(fromClient, m)
		}
	}
	ch := &scriptChannel{in: fromClient}
	l := &cmScripted{ch: ch}
	l.dests = []Dest{{OutReads: 1, QPN: 0x33, PSN: 0x44, RKey: 0x55, VAddr: 0x1000, GID: GIDFromAddr(netip.MustParseAddr("10.77.0.11"))}}
	test := Test{Verb: Write, Measure: BW, Transport: RC, QPs: 1, Size: 4096, SizeGiven: true}
	out, err := RunCM(context.Background(), ch, Config{Test: test, MTU: 3, PageSize: 4096, CacheLine: 64}, 1, l)
	if err != nil {
		t.Fatal(err)
	}
	if out.Remote[0].Addr() != netip.MustParseAddr("10.77.0.10") || out.Remote[0].QPN != 0x1b {
		t.Errorf("remote %+v", out.Remote[0])
	}
	records := 0
	for _, m := range ch.sent {
		if len(m) == CMDestSize {
			t.Fatalf("answered a 64-byte record with a 56-byte one")
		}
		if len(m) == CMDestSizeTail {
			records++
			if d, _, err := ParseCMDest(m); err != nil || (d != Dest{} && d != l.dests[0]) {
				t.Errorf("our record %+v %v", d, err)
			}
		}
	}
	if records != 7 {
		t.Errorf("%d records sent, want 7 (2 zero records, keys twice, 2 barriers, close)", records)
	}
}
