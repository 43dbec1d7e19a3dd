package pingpong

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/frame/frametest"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/port/memlink"
)

// captureName is a real `ibv_rc_pingpong -g 1 -s 4096 -n 20` between two
// rxe hosts (read-only shared vector).
const captureName = "rc_pingpong.pcap"

// rocePkt is one RoCE packet of the capture.
type rocePkt struct {
	fromClient bool
	bth        bth.BTH
	payload    []byte // after the BTH, before pad and ICRC
}

// readCapture returns the TCP side-channel payloads and the RoCE packets,
// in capture order; the client is the end that sent the first payload.
func readCapture(t *testing.T) (tcp []message, roce []rocePkt) {
	t.Helper()
	f, err := os.Open(filepath.Join(frametest.VectorsDir(t), captureName))
	if err != nil {
		t.Skipf("reference capture not available: %v", err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var client netip.Addr
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := gopacket.NewPacket(data, r.LinkType(), gopacket.Default)
		ip4, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if !ok {
			continue
		}
		src, _ := netip.AddrFromSlice(ip4.SrcIP)
		if tl, ok := p.Layer(layers.LayerTypeTCP).(*layers.TCP); ok && len(tl.Payload) > 0 {
			if !client.IsValid() {
				client = src
			}
			tcp = append(tcp, message{fromClient: src == client, data: append([]byte(nil), tl.Payload...)})
		}
		if ul, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); ok && ul.DstPort == 4791 {
			b := bth.BTH(ul.Payload[:bth.BTHLen])
			end := len(ul.Payload) - 4 - b.PadCount()
			roce = append(roce, rocePkt{fromClient: src == client, bth: b, payload: ul.Payload[bth.BTHLen:end]})
		}
	}
	return tcp, roce
}

type message struct {
	fromClient bool
	data       []byte
}

// TestCaptureSideChannel checks the codec against the records and "done"
// the stock tools exchanged, byte for byte.
func TestCaptureSideChannel(t *testing.T) {
	tcp, _ := readCapture(t)
	if len(tcp) != 3 || !tcp[0].fromClient || tcp[1].fromClient || !tcp[2].fromClient {
		t.Fatalf("side channel: want client record, server record, client done; got %d messages", len(tcp))
	}
	want := []Dest{
		{QPN: 0x1c, PSN: 0xb5a0cd, GID: GIDFromAddr(netip.MustParseAddr("10.77.0.10"))},
		{QPN: 0x1c, PSN: 0x078d22, GID: GIDFromAddr(netip.MustParseAddr("10.77.0.11"))},
	}
	for i, m := range tcp[:2] {
		if len(m.data) != RecordLen {
			t.Fatalf("record %d is %d bytes", i, len(m.data))
		}
		d, err := ParseDest(m.data)
		if err != nil {
			t.Fatal(err)
		}
		if d != want[i] {
			t.Errorf("record %d: %+v, want %+v", i, d, want[i])
		}
		if enc := d.Marshal(); !bytes.Equal(enc[:], m.data) {
			t.Errorf("record %d re-encoded:\n %q\nwant\n %q", i, enc[:], m.data)
		}
		if a := d.Addr(); a != netip.MustParseAddr(fmt.Sprintf("10.77.0.1%d", i)) {
			t.Errorf("record %d address %v", i, a)
		}
	}
	if !bytes.Equal(tcp[2].data, done[:]) {
		t.Errorf("client's last message %q, want %q", tcp[2].data, done[:])
	}

	// The server's half against the client's real bytes: it reads the
	// record, connects, answers with its own and takes "done".
	c, s := net.Pipe()
	defer c.Close()
	go func() {
		if _, err := c.Write(tcp[0].data); err != nil {
			t.Error(err)
			return
		}
		if _, err := io.ReadFull(c, make([]byte, RecordLen)); err != nil {
			t.Error(err)
			return
		}
		if _, err := c.Write(tcp[2].data); err != nil {
			t.Error(err)
		}
	}()
	var connected Dest
	got, err := ServerExchange(s, want[1], func(d Dest) error { connected = d; return nil })
	if err != nil || got != want[0] || connected != want[0] {
		t.Fatalf("ServerExchange: %+v %v (connected to %+v)", got, err, connected)
	}
}

// TestCaptureData checks the ping-pong on the wire: the client's first
// SEND starts at the PSN of its record and goes to the server's QPN; each
// side sends -n messages of -s bytes, the server echoing the client's
// buffer, all of the stock tools' fill byte (this capture ran without
// --chk, so no page marks: the check must reject every page of it).
func TestCaptureData(t *testing.T) {
	tcp, roce := readCapture(t)
	cl, _ := ParseDest(tcp[0].data)
	sv, _ := ParseDest(tcp[1].data)
	msgs := map[bool][][]byte{}
	cur := map[bool][]byte{}
	first := map[bool]bool{}
	for _, p := range roce {
		op := p.bth.Opcode()
		switch op {
		case bth.RCSendFirst, bth.RCSendMiddle, bth.RCSendLast, bth.RCSendOnly:
		default:
			continue
		}
		if !first[p.fromClient] {
			first[p.fromClient] = true
			self, peer := cl, sv
			if !p.fromClient {
				self, peer = sv, cl
			}
			if uint32(p.bth.PSN()) != self.PSN || p.bth.DestQP() != peer.QPN {
				t.Errorf("first SEND from client=%v: PSN %#x to QP %#x, want PSN %#x to QP %#x", p.fromClient, p.bth.PSN(), p.bth.DestQP(), self.PSN, peer.QPN)
			}
		}
		cur[p.fromClient] = append(cur[p.fromClient], p.payload...)
		if op == bth.RCSendLast || op == bth.RCSendOnly {
			msgs[p.fromClient] = append(msgs[p.fromClient], cur[p.fromClient])
			cur[p.fromClient] = nil
		}
	}
	for _, side := range []bool{true, false} {
		if len(msgs[side]) != 20 {
			t.Fatalf("client=%v sent %d messages, want 20", side, len(msgs[side]))
		}
		for i, m := range msgs[side] {
			if len(m) != 4096 || !bytes.Equal(m, msgs[true][0]) {
				t.Fatalf("client=%v message %d: %d bytes, not the client's first", side, i, len(m))
			}
		}
	}
	m := msgs[true][0]
	if bytes.Count(m, []byte{fillByte}) != len(m) {
		t.Fatalf("message is not all %#x", fillByte)
	}
	if bad := badPages(m, nil); len(bad) != 1 || bad[0] != 0 {
		t.Fatalf("unmarked 4096-byte message: bad pages %v, want [0]", bad)
	}
	marked := append([]byte(nil), m...)
	markPages(marked)
	if bad := badPages(marked, nil); len(bad) != 0 {
		t.Fatalf("marked message: bad pages %v", bad)
	}
	for i := range marked {
		if marked[i] != PatternByte(i) {
			t.Fatalf("byte %d = %#x, PatternByte %#x", i, marked[i], PatternByte(i))
		}
	}
}

// TestParseDestHostile rejects what is not a record, without panicking.
func TestParseDestHostile(t *testing.T) {
	good := Dest{LID: 1, QPN: 0xabcdef, PSN: 0x123456, GID: GIDFromAddr(netip.MustParseAddr("fd00::1"))}.Marshal()
	if d, err := ParseDest(good[:]); err != nil || d.QPN != 0xabcdef || d.Addr() != netip.MustParseAddr("fd00::1") {
		t.Fatalf("good record: %+v %v", d, err)
	}
	for _, s := range []string{"", "done", "0000:000000:000000", "0000:1000000:000000:00000000000000000000ffff0a4d000a",
		"0000:00001c:b5a0cd:00000000000000000000ffff0a4d000", "0000:00001c:b5a0cd:00000000000000000000ffff0a4d000g",
		"10000:00001c:b5a0cd:00000000000000000000ffff0a4d000a", ":00001c:b5a0cd:00000000000000000000ffff0a4d000a",
		"0000:-1:b5a0cd:00000000000000000000ffff0a4d000a", "0000:00001c:b5a0cd:00000000000000000000ffff0a4d000a:"} {
		if _, err := ParseDest([]byte(s)); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
	var zero Dest
	if zero.Addr().IsValid() {
		t.Error("zero GID has an address")
	}
}

func FuzzParseDest(f *testing.F) {
	g := Dest{QPN: 0x11, PSN: 1, GID: GIDFromAddr(netip.MustParseAddr("10.0.0.1"))}.Marshal()
	f.Add(g[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseDest(b)
		if err != nil {
			return
		}
		enc := d.Marshal()
		if d2, err := ParseDest(enc[:]); err != nil || d2 != d {
			t.Fatalf("round trip %+v -> %q -> %+v %v", d, enc, d2, err)
		}
	})
}

func TestParseArgs(t *testing.T) {
	p, err := ParseArgs(RC, strings.Fields("-d eth0 -g 1 -m 4096 -s 4096 -n 100 --chk 10.0.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Device != "eth0" || p.GIDIndex != 1 || p.MTU != 4096 || p.Size != 4096 || p.Iters != 100 || !p.Check || p.Host != "10.0.0.2" || p.Port != 18515 || p.RxDepth != 500 {
		t.Fatalf("%+v", p)
	}
	p, err = ParseArgs(UD, strings.Fields("10.0.0.2 --ib-dev=eth1 -s1024 --iters=7 -c -p 0x4000"))
	if err != nil || p.Device != "eth1" || p.Size != 1024 || p.Iters != 7 || !p.Check || p.Host != "10.0.0.2" || p.Port != 0x4000 || p.GIDIndex != -1 {
		t.Fatalf("%+v %v", p, err)
	}
	p, err = ParseArgs(RC, strings.Fields("-d eth0 --cc dcqcn --host-cc=fill=1,hold=1ms"))
	if err != nil || p.CC != "dcqcn" || p.HostCC != "fill=1,hold=1ms" {
		t.Fatalf("--host-cc: %+v %v", p, err)
	}
	if cc, err := ccOf(p); err != nil || cc.HostCC.FillLow != 1 || cc.HostCC.Hold != time.Millisecond {
		t.Fatalf("--host-cc reaches the device as %+v, %v", cc.HostCC, err)
	}
	if d := DefaultParams(UD); d.Size != 1024 || d.Iters != 1000 {
		t.Fatalf("UD defaults %+v", d)
	}
	for _, bad := range []string{"-s", "-d x -m 1000", "-d x -q 1", "-d x a b", "-d x -r 1", "-d x --chk=1", "-d x -s 0",
		"-d x --host-cc", "-d x --host-cc=fill=2"} {
		if _, err := ParseArgs(RC, strings.Fields(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	// Without -d the flags parse (--daemon implies the interface);
	// RunCLI refuses a run with neither.
	if _, err := RunCLI(context.Background(), DefaultParams(RC), CLIOptions{}, io.Discard); err == nil || !strings.Contains(err.Error(), "-d INTERFACE is required") {
		t.Errorf("RunCLI without -d or --daemon: %v", err)
	}
	if _, err := ParseArgs(RC, []string{"--help"}); !errors.Is(err, ErrHelp) {
		t.Errorf("--help: %v", err)
	}
}

// memHosts returns two hosts on devices joined by an in-memory link.
func memHosts(t *testing.T, mtu int) (a, b Host) { return memHostsTap(t, mtu, nil, ib.RecoveryDefault) }

// memHostsTap is memHosts with a capture tap on b's engine (the client's
// in runMem).
func memHostsTap(t *testing.T, mtu int, tap *capture.Tap, rec ib.Recovery) (a, b Host) {
	pa, pb := memlink.NewPair(memlink.Config{MaxFrame: mtu + 200})
	t.Cleanup(func() { pa.Close(); pb.Close() })
	ia := host.Interface{Name: "mla", MTU: mtu, MAC: [6]byte{2, 0, 0, 0, 0, 0xa}, GIDs: []netip.Addr{netip.MustParseAddr("10.7.0.1")}}
	ifb := host.Interface{Name: "mlb", MTU: mtu, MAC: [6]byte{2, 0, 0, 0, 0, 0xb}, GIDs: []netip.Addr{netip.MustParseAddr("10.7.0.2")}}
	start := func(in host.Interface, p *memlink.Port, peer host.Interface, tap *capture.Tap) Host {
		dev, err := host.NewDevice(in, host.DeviceOptions{Recovery: rec, Resolve: func(_ context.Context, a netip.Addr) ([6]byte, error) {
			if a != peer.GIDs[0] {
				return [6]byte{}, fmt.Errorf("no route to %v", a)
			}
			return peer.MAC, nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- engine.Run(ctx, dev, p, engine.Options{Tap: tap}) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("engine: %v", err)
			}
		})
		return Host{Device: dev, Iface: in}
	}
	return start(ia, pa, ifb, nil), start(ifb, pb, ia, tap)
}

// runMem runs a server on s and a client on c over a pipe.
func runMem(t *testing.T, s, c Host, ps, pc Params) (sr, cr Result, sout, cout string, serr, cerr error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	pc.Host = "peer"
	var so, co bytes.Buffer
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		sr, serr = Run(ctx, s, ps, a, &so)
		if serr != nil {
			a.Close()
			cancel() // the client is waiting for a message that will not come
		}
	}()
	cr, cerr = Run(ctx, c, pc, b, &co)
	if cerr != nil {
		b.Close()
		cancel()
	}
	<-ch
	return sr, cr, so.String(), co.String(), serr, cerr
}

// TestPingpongMemlink runs rc and ud with --chk between two devices: every
// message checked on both ends, the report lines printed.
func TestPingpongMemlink(t *testing.T) {
	for _, tc := range []struct {
		tr        Transport
		mtu, size int
	}{{RC, 1024, 4096}, {RC, 4096, 10000}, {RC, 1024, 1}, {UD, 1024, 1024}, {UD, 4096, 4096}, {UD, 1024, 5}} {
		t.Run(fmt.Sprintf("%v/mtu%d/s%d", tc.tr, tc.mtu, tc.size), func(t *testing.T) {
			s, c := memHosts(t, tc.mtu+100)
			p := DefaultParams(tc.tr)
			p.Device, p.Size, p.Iters, p.Check, p.RxDepth = "ml", tc.size, 50, true, 16
			if tc.tr == RC {
				p.MTU = tc.mtu
			}
			sr, cr, sout, cout, serr, cerr := runMem(t, s, c, p, p)
			if serr != nil || cerr != nil {
				t.Fatalf("server: %v\nclient: %v\n%s\n%s", serr, cerr, sout, cout)
			}
			for _, r := range []Result{sr, cr} {
				if r.Checked != 50 || r.Iters != 50 || r.Bytes != int64(tc.size)*100 {
					t.Fatalf("result %+v", r)
				}
			}
			if sr.Remote != cr.Local || cr.Remote != sr.Local {
				t.Fatalf("records: server %+v client %+v", sr, cr)
			}
			for _, out := range []string{sout, cout} {
				if !strings.Contains(out, fmt.Sprintf("%d bytes in ", tc.size*100)) || !strings.Contains(out, "50 iters in ") ||
					!strings.Contains(out, "  local address:  LID 0x0000, QPN 0x") || !strings.Contains(out, "  remote address: LID 0x0000") {
					t.Fatalf("output:\n%s", out)
				}
			}
		})
	}
}

// TestPingpongChkDetects: a client without --chk sends unmarked pages,
// which a --chk server must reject (the check is not vacuous).
func TestPingpongChkDetects(t *testing.T) {
	s, c := memHosts(t, 1200)
	ps := DefaultParams(RC)
	ps.Device, ps.Iters, ps.Check, ps.RxDepth = "ml", 5, true, 8
	pc := ps
	pc.Check = false
	sr, _, sout, _, serr, _ := runMem(t, s, c, ps, pc)
	if serr == nil || !strings.Contains(serr.Error(), "--chk") || len(sr.BadPages) != 1 || !strings.Contains(sout, "invalid data in page 0\n") {
		t.Fatalf("server accepted unmarked data: %v %v\n%s", serr, sr.BadPages, sout)
	}
}

// TestSessionNoAllocPerMessage: reposting a receive and checking a
// received message cost no allocation on this side (one WR and SGE reused,
// the bad-page list reused).
func TestSessionNoAllocPerMessage(t *testing.T) {
	s, _ := memHosts(t, 1200)
	ss := &session{h: s, p: DefaultParams(RC), ctx: context.Background()}
	ss.p.Size, ss.p.RxDepth, ss.p.Check = 4096, 256, true
	if err := ss.setup(); err != nil {
		t.Fatal(err)
	}
	defer ss.close()
	markPages(ss.data())
	wc := ib.WC{ID: recvWRID, Status: ib.Success, ByteLen: 4096}
	if n := testing.AllocsPerRun(100, func() {
		if err := ss.received(&wc); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("checking a message allocates %v", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := ss.postRecvs(1); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("reposting a receive allocates %v", n)
	}
}

// sendMessages reassembles the RC SEND messages of each direction from
// a list of packets, with the opcodes, in order.
func sendMessages(pkts []rocePkt) (msgs map[bool][][]byte, ops map[bool][]bth.Opcode, firstPSN map[bool]uint32) {
	msgs, ops, firstPSN = map[bool][][]byte{}, map[bool][]bth.Opcode{}, map[bool]uint32{}
	cur := map[bool][]byte{}
	for _, p := range pkts {
		op := p.bth.Opcode()
		switch op {
		case bth.RCSendFirst, bth.RCSendMiddle, bth.RCSendLast, bth.RCSendOnly:
		default:
			continue
		}
		if _, ok := firstPSN[p.fromClient]; !ok {
			firstPSN[p.fromClient] = uint32(p.bth.PSN())
		}
		ops[p.fromClient] = append(ops[p.fromClient], op)
		cur[p.fromClient] = append(cur[p.fromClient], p.payload...)
		if op == bth.RCSendLast || op == bth.RCSendOnly {
			msgs[p.fromClient] = append(msgs[p.fromClient], cur[p.fromClient])
			cur[p.fromClient] = nil
		}
	}
	return msgs, ops, firstPSN
}

// TestWireAsCapture runs the capture's command (rc -s 4096 -n 20, path
// MTU 1024) between two softrnic devices and holds softrnic's frames
// against rxe's: the same SEND_FIRST/MIDDLE/LAST sequence each way, from
// each side's record PSN, the same payload bytes (the stock fill, echoed),
// valid ICRCs; then with --chk, the same bytes with each page's mark.
func TestWireAsCapture(t *testing.T) {
	_, ref := readCapture(t)
	refMsgs, refOps, _ := sendMessages(ref)
	for _, chk := range []bool{false, true} {
		t.Run(fmt.Sprintf("chk=%v", chk), func(t *testing.T) {
			var tap capture.Tap
			// rxe's recovery: on a loaded host adaptive retransmission
			// may repeat a packet the peer was merely slow to answer,
			// which the comparison would count as a difference.
			s, c := memHostsTap(t, 1200, &tap, ib.RecoveryTimeout)
			var file bytes.Buffer
			sess, err := tap.Start(&file, capture.Options{Format: capture.PCAP})
			if err != nil {
				t.Fatal(err)
			}
			p := DefaultParams(RC)
			p.Device, p.Size, p.Iters, p.MTU, p.Check = "ml", 4096, 20, 1024, chk
			sr, cr, _, _, serr, cerr := runMem(t, s, c, p, p)
			if serr != nil || cerr != nil {
				t.Fatalf("server: %v client: %v", serr, cerr)
			}
			if _, err := sess.Stop(); err != nil {
				t.Fatal(err)
			}
			frames, err := frametest.Read(&file)
			if err != nil {
				t.Fatal(err)
			}
			var pkts []rocePkt
			for _, fb := range frames {
				var f frame.Frame
				if err := frame.Parse(fb, &f); err != nil || !f.VerifyICRC() {
					t.Fatalf("frame: %v (ICRC ok %v)", err, err == nil && f.VerifyICRC())
				}
				b := f.BTH()
				if op := f.Opcode(); (op == bth.RCSendLast) != b.AckReq() {
					t.Errorf("opcode %v with AckReq %v", op, b.AckReq())
				}
				pkts = append(pkts, rocePkt{fromClient: f.Src() == c.Iface.GIDs[0], bth: b, payload: f.Payload()})
			}
			msgs, ops, first := sendMessages(pkts)
			if first[true] != cr.Local.PSN || first[false] != sr.Local.PSN {
				t.Errorf("first PSNs %#x/%#x, records %#x/%#x", first[true], first[false], cr.Local.PSN, sr.Local.PSN)
			}
			want := append([]byte(nil), refMsgs[true][0]...)
			if chk {
				markPages(want)
			}
			for _, side := range []bool{true, false} {
				if !slices.Equal(ops[side], refOps[side]) {
					t.Errorf("client=%v opcodes differ from rxe's:\n%v\n%v", side, ops[side], refOps[side])
				}
				if len(msgs[side]) != len(refMsgs[side]) {
					t.Fatalf("client=%v: %d messages, rxe %d", side, len(msgs[side]), len(refMsgs[side]))
				}
				for i, m := range msgs[side] {
					if !bytes.Equal(m, want) {
						t.Fatalf("client=%v message %d differs from rxe's (chk %v)", side, i, chk)
					}
				}
			}
		})
	}
}
