package perftest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/frame/frametest"
)

// message is one write on the side channel as captured: one TCP segment.
type message struct {
	fromClient bool
	data       []byte
}

// sideChannel returns the payload-carrying TCP segments between the
// capture's perftest client and server, in capture order, skipping
// retransmissions. The client is the end that sent the first payload.
func sideChannel(t *testing.T, name string) []message {
	t.Helper()
	f, err := os.Open(filepath.Join(frametest.VectorsDir(t), name))
	if err != nil {
		t.Skipf("reference capture not available: %v", err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var (
		msgs    []message
		client  string
		nextSeq = map[string]uint32{}
	)
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := gopacket.NewPacket(data, r.LinkType(), gopacket.DecodeOptions{Lazy: true, NoCopy: true})
		tcpL, ok := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if !ok || len(tcpL.Payload) == 0 {
			continue
		}
		var src string
		if ip4, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
			src = fmt.Sprintf("%v:%d", ip4.SrcIP, tcpL.SrcPort)
		} else if ip6, ok := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok {
			src = fmt.Sprintf("[%v]:%d", ip6.SrcIP, tcpL.SrcPort)
		} else {
			continue
		}
		if client == "" {
			client = src
		}
		if want, seen := nextSeq[src]; seen && int32(tcpL.Seq-want) < 0 {
			continue // retransmission
		}
		nextSeq[src] = tcpL.Seq + uint32(len(tcpL.Payload))
		msgs = append(msgs, message{fromClient: src == client, data: append([]byte(nil), tcpL.Payload...)})
	}
	if len(msgs) == 0 {
		t.Fatalf("%s: no side channel", name)
	}
	return msgs
}

// firstRecord returns the first key record one end sent.
func firstRecord(t *testing.T, msgs []message, fromClient bool) Dest {
	t.Helper()
	for _, m := range msgs {
		if m.fromClient == fromClient && len(m.data) == KeyRecordSize {
			d, err := ParseRecord(m.data)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
	}
	t.Fatal("no key record")
	return Dest{}
}

// captureReport returns the client's five report values from a capture.
func captureReport(msgs []message) (BWReport, bool) {
	var v []uint64
	for _, m := range msgs {
		if m.fromClient && len(m.data) == 8 {
			v = append(v, binary.BigEndian.Uint64(m.data))
		}
	}
	if len(v) != reportValues {
		return BWReport{}, false
	}
	return BWReport{Size: v[0], Iters: v[1], PeakBW: math.Float64frombits(v[2]), AvgBW: math.Float64frombits(v[3]), MsgRate: math.Float64frombits(v[4])}, true
}

// scriptedLocal is a device stand-in that returns fixed records and checks
// the calls a test makes.
type scriptedLocal struct {
	t         *testing.T
	dests     []Dest
	report    BWReport
	wantMTU   MTU
	connected []Dest
	runs      []uint64
	recvs     []uint64
}

func (s *scriptedLocal) Dests(n Negotiated) ([]Dest, error) {
	if s.wantMTU != 0 && n.MTU != s.wantMTU {
		return nil, fmt.Errorf("negotiated MTU %d, want %d", n.MTU, s.wantMTU)
	}
	if n.PageSize != 4096 || n.CacheLine != 64 {
		return nil, fmt.Errorf("negotiated page %d cache line %d", n.PageSize, n.CacheLine)
	}
	return s.dests, nil
}
func (s *scriptedLocal) Connect(r []Dest) error         { s.connected = append([]Dest(nil), r...); return nil }
func (s *scriptedLocal) PostReceives(size uint64) error { s.recvs = append(s.recvs, size); return nil }
func (s *scriptedLocal) Run(size uint64) (BWReport, error) {
	s.runs = append(s.runs, size)
	return s.report, nil
}

// loopback returns two ends of a TCP connection over 127.0.0.1, closed at
// cleanup, with a deadline so that a protocol mismatch fails instead of hanging.
func loopback(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			acc <- nil
			return
		}
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-acc
	if server == nil {
		t.Fatal("accept failed")
	}
	deadline := time.Now().Add(20 * time.Second)
	if err := client.SetDeadline(deadline); err != nil {
		t.Fatal(err)
	}
	if err := server.SetDeadline(deadline); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// replay plays one end of a captured channel: it writes that end's
// messages and reads the other end's, comparing them with the capture
// through match (nil: byte for byte).
func replay(conn net.Conn, msgs []message, asClient bool, match func(i int, want, got []byte) error) error {
	for i, m := range msgs {
		if m.fromClient == asClient {
			if _, err := conn.Write(m.data); err != nil {
				return fmt.Errorf("message %d: %w", i, err)
			}
			continue
		}
		got := make([]byte, len(m.data))
		if _, err := io.ReadFull(conn, got); err != nil {
			return fmt.Errorf("message %d (%d bytes %q): %w", i, len(m.data), m.data, err)
		}
		if match != nil {
			if err := match(i, m.data, got); err != nil {
				return err
			}
		} else if !bytes.Equal(got, m.data) {
			return fmt.Errorf("message %d: got %q, want %q", i, got, m.data)
		}
	}
	return nil
}

var captures = []struct {
	file string
	test Test
	mtu  MTU
}{
	{"write_bw_rc.pcap", Test{Verb: Write, Measure: BW, Transport: RC, QPs: 1, Size: 4096, SizeGiven: true}, 3},
	{"read_bw_rc.pcap", Test{Verb: Read, Measure: BW, Transport: RC, QPs: 1, Size: 4096, SizeGiven: true}, 3},
	{"send_bw_rc.pcap", Test{Verb: Send, Measure: BW, Transport: RC, QPs: 1, Size: 4096, SizeGiven: true}, 3},
	{"send_bw_ud.pcap", Test{Verb: Send, Measure: BW, Transport: UD, QPs: 1, Size: 1024, SizeGiven: true}, 3},
	{"atomic_bw_rc.pcap", Test{Verb: Atomic, Measure: BW, Transport: RC, QPs: 1, Size: 8}, 3},
	{"v6_write_bw_rc.pcap", Test{Verb: Write, Measure: BW, Transport: RC, QPs: 1, Size: 4096, SizeGiven: true}, 3},
	{"v6_send_bw_ud.pcap", Test{Verb: Send, Measure: BW, Transport: UD, QPs: 1, Size: 1024, SizeGiven: true}, 3},
	{"v6_atomic_bw_rc.pcap", Test{Verb: Atomic, Measure: BW, Transport: RC, QPs: 1, Size: 8}, 3},
	{"mtu4096_write_bw_rc.pcap", Test{Verb: Write, Measure: BW, Transport: RC, QPs: 1, Size: 65536, SizeGiven: true}, 5},
	{"mtu4096_send_bw_rc.pcap", Test{Verb: Send, Measure: BW, Transport: RC, QPs: 1, Size: 16384, SizeGiven: true}, 5},
}

// TestClientMatchesCapture runs our client against the capture's server
// stream: every byte our client writes must equal what perftest's client
// wrote, given the same QP numbers, PSN, rkey, buffer address and results.
func TestClientMatchesCapture(t *testing.T) {
	for _, tc := range captures {
		t.Run(tc.file, func(t *testing.T) {
			msgs := sideChannel(t, tc.file)
			rep, hasRep := captureReport(msgs)
			local := &scriptedLocal{t: t, dests: []Dest{firstRecord(t, msgs, true)}, report: rep, wantMTU: tc.mtu}
			cc, sc := loopback(t)
			errc := make(chan error, 1)
			go func() {
				err := replay(sc, msgs, false, nil)
				if err != nil {
					sc.Close() // unblock our client
				}
				errc <- err
			}()
			out, err := Run(context.Background(), cc, Config{Test: tc.test, Client: true, MTU: tc.mtu, PageSize: 4096, CacheLine: 64}, local)
			if rerr := <-errc; rerr != nil {
				t.Fatalf("capture's server saw a different client: %v (client: %v)", rerr, err)
			}
			if err != nil {
				t.Fatalf("client: %v", err)
			}
			if out.PeerVersion != "6.06" || out.MTU != tc.mtu {
				t.Errorf("negotiated %+v", out.Negotiated)
			}
			if want := firstRecord(t, msgs, false); len(local.connected) != 1 || local.connected[0] != want {
				t.Errorf("connected to %+v, want %+v", local.connected, want)
			}
			if len(local.runs) != 1 || local.runs[0] != tc.test.Size {
				t.Errorf("runs %v, want one of %d", local.runs, tc.test.Size)
			}
			if hasRep != (out.PeerReport != nil) {
				t.Errorf("report exchange: capture has one %v, we did one %v", hasRep, out.PeerReport != nil)
			}
		})
	}
}

// TestServerMatchesCapture runs our server against the capture's client
// stream: it must accept it and answer with the same sequence of messages,
// byte for byte except the passive server's report values, which perftest
// leaves uninitialised and we fill with the message size and zeros.
func TestServerMatchesCapture(t *testing.T) {
	for _, tc := range captures {
		t.Run(tc.file, func(t *testing.T) {
			msgs := sideChannel(t, tc.file)
			local := &scriptedLocal{t: t, dests: []Dest{firstRecord(t, msgs, false)}, wantMTU: tc.mtu}
			cc, sc := loopback(t)
			reportIdx := 0
			match := func(i int, want, got []byte) error {
				if len(want) == 8 && len(got) == 8 {
					wantV := [reportValues]uint64{tc.test.Size, 0, 0, 0, 0}
					if v := binary.BigEndian.Uint64(got); v != wantV[reportIdx] {
						return fmt.Errorf("report value %d = %#x, want %#x", reportIdx, v, wantV[reportIdx])
					}
					reportIdx++
					return nil
				}
				if !bytes.Equal(got, want) {
					return fmt.Errorf("message %d: got %q, want %q", i, got, want)
				}
				return nil
			}
			errc := make(chan error, 1)
			go func() {
				err := replay(cc, msgs, true, match)
				if err != nil {
					cc.Close() // unblock our server
				}
				errc <- err
			}()
			out, err := Run(context.Background(), sc, Config{Test: tc.test, Client: false, MTU: tc.mtu, PageSize: 4096, CacheLine: 64}, local)
			if rerr := <-errc; rerr != nil {
				t.Fatalf("capture's client saw a different server: %v (server: %v)", rerr, err)
			}
			if err != nil {
				t.Fatalf("server: %v", err)
			}
			clientRec := firstRecord(t, msgs, true)
			if len(local.connected) != 1 || local.connected[0] != clientRec {
				t.Errorf("connected to %+v, want %+v", local.connected, clientRec)
			}
			if rep, ok := captureReport(msgs); ok {
				if out.PeerReport == nil || *out.PeerReport != rep {
					t.Errorf("peer report %+v, want %+v", out.PeerReport, rep)
				}
			}
			if tc.test.Verb == Send {
				if len(local.recvs) != 1 || len(local.runs) != 1 {
					t.Errorf("send server: recvs %v runs %v", local.recvs, local.runs)
				}
			} else if len(local.runs) != 0 {
				t.Errorf("passive server ran %v", local.runs)
			}
		})
	}
}
