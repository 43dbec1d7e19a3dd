package rping

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/frame/frametest"
)

// rcFrame is one RC packet of a capture, headers parsed by hand.
type rcFrame struct {
	src     netip.Addr
	opcode  uint8
	reth    Info // VA, rkey, DMA length for READ_REQ / WRITE_ONLY
	payload []byte
}

const (
	opSendOnly     = 0x04
	opWriteOnly    = 0x0A
	opReadRequest  = 0x0C
	opReadRespOnly = 0x10
	opAck          = 0x11
)

func readRC(t *testing.T, name string) []rcFrame {
	t.Helper()
	f, err := os.Open(filepath.Join(frametest.VectorsDir(t), name))
	if err != nil {
		t.Skipf("capture not available: %v", err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []rcFrame
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var src netip.Addr
		var udp []byte
		switch binary.BigEndian.Uint16(data[12:]) {
		case 0x0800:
			src = netip.AddrFrom4([4]byte(data[26:30]))
			udp = data[14+int(data[14]&15)*4:]
		case 0x86DD:
			src = netip.AddrFrom16([16]byte(data[22:38]))
			udp = data[54:]
		default:
			continue
		}
		if len(udp) < 8+12+4 || binary.BigEndian.Uint16(udp[2:]) != 4791 {
			continue
		}
		bth := udp[8 : len(udp)-4] // without the ICRC
		if binary.BigEndian.Uint32(bth[4:])&0xFFFFFF == 1 {
			continue // CM on QP1
		}
		fr := rcFrame{src: src, opcode: bth[0]}
		pad := int(bth[1]>>4) & 3
		rest := bth[12:]
		switch fr.opcode {
		case opWriteOnly, opReadRequest:
			fr.reth = Info{Buf: binary.BigEndian.Uint64(rest), RKey: binary.BigEndian.Uint32(rest[8:]), Size: binary.BigEndian.Uint32(rest[12:])}
			rest = rest[16:]
		case opReadRespOnly, opAck:
			rest = rest[4:] // AETH
		}
		fr.payload = rest[:len(rest)-pad]
		out = append(out, fr)
	}
}

// TestAgainstStockRping replays rping -c -a 10.77.0.11 -C 10 -S 64 -v
// between two rxe hosts: our client and server machines, fed what the
// other side sent, must post exactly what the stock tool posted, and
// FillPing must reproduce its data byte for byte.
func TestAgainstStockRping(t *testing.T) {
	for _, file := range []string{"rping.pcap", "v6_rping.pcap"} {
		t.Run(file, func(t *testing.T) {
			var frames []rcFrame
			for _, f := range readRC(t, file) {
				if f.opcode != opAck {
					frames = append(frames, f)
				}
			}
			const pings, size = 10, 64
			if len(frames) != 7*pings {
				t.Fatalf("%d non-ACK RC frames, want %d", len(frames), 7*pings)
			}
			client := frames[0].src
			start, _ := DecodeInfo(frames[0].payload)
			sink, _ := DecodeInfo(frames[4].payload)
			c := Client{Start: start, Sink: sink, Count: pings}
			s := Server{Buf: make([]byte, size)}
			expect := func(i int, from bool, op uint8) rcFrame {
				t.Helper()
				f := frames[i]
				if (f.src == client) != from || f.opcode != op {
					t.Fatalf("frame %d: opcode %#x from %v, want %#x from client=%v", i, f.opcode, f.src, op, from)
				}
				return f
			}
			encode := func(i Info) []byte {
				var b [InfoSize]byte
				i.Encode(b[:])
				return b[:]
			}
			act := c.Begin()
			want := make([]byte, size)
			for p := range pings {
				base := 7 * p
				// 1. The client advertises its start buffer.
				f := expect(base, true, opSendOnly)
				if act.Kind != ActSendInfo || !bytes.Equal(f.payload, encode(act.Info)) || act.Info.Size != size {
					t.Fatalf("ping %d: client posted %+v, rping sent %x", p, act, f.payload)
				}
				// 2. The server reads it.
				sa, err := s.OnRecv(f.payload)
				f = expect(base+1, false, opReadRequest)
				if err != nil || sa.Kind != ActRDMARead || sa.Remote != f.reth || f.reth != start {
					t.Fatalf("ping %d: server posted %+v (%v), rping read %+v", p, sa, err, f.reth)
				}
				// 3. The data: rping's ping pattern.
				f = expect(base+2, true, opReadRespOnly)
				FillPing(want, p)
				if !bytes.Equal(f.payload, want) {
					t.Fatalf("ping %d: data %q, FillPing %q", p, f.payload, want)
				}
				copy(s.Buf, f.payload)
				// 4. Go ahead.
				sa, err = s.OnComplete()
				f = expect(base+3, false, opSendOnly)
				if err != nil || sa.Kind != ActSendInfo || !bytes.Equal(f.payload, encode(sa.Info)) {
					t.Fatalf("ping %d: go-ahead %+v, rping sent %x", p, sa, f.payload)
				}
				// 5. The client advertises its sink.
				act, err = c.OnRecv(f.payload)
				f = expect(base+4, true, opSendOnly)
				if err != nil || act.Kind != ActSendInfo || !bytes.Equal(f.payload, encode(act.Info)) {
					t.Fatalf("ping %d: client posted %+v, rping sent %x", p, act, f.payload)
				}
				// 6. The server writes the string back.
				sa, err = s.OnRecv(f.payload)
				f = expect(base+5, false, opWriteOnly)
				if err != nil || sa.Kind != ActRDMAWrite || sa.Remote.Buf != f.reth.Buf || sa.Remote.RKey != f.reth.RKey ||
					uint32(sa.Len) != f.reth.Size || !bytes.Equal(f.payload, s.Buf[:sa.Len]) {
					t.Fatalf("ping %d: server posted %+v, rping wrote %+v", p, sa, f.reth)
				}
				// 7. Go ahead; the client moves to the next ping.
				sa, _ = s.OnComplete()
				f = expect(base+6, false, opSendOnly)
				if !bytes.Equal(f.payload, encode(sa.Info)) {
					t.Fatal("second go-ahead differs")
				}
				act, err = c.OnRecv(f.payload)
				if err != nil || (p == pings-1) != (act.Kind == ActDone) {
					t.Fatalf("ping %d: client then %+v, %v", p, act, err)
				}
			}
		})
	}
}

func TestFillPingEdges(t *testing.T) {
	b := make([]byte, MinSize)
	FillPing(b, 2147483647)
	if string(b[:len("rdma-ping-2147483647: ")]) != "rdma-ping-2147483647: " || b[MinSize-1] != 0 {
		t.Fatalf("%q", b)
	}
	b = make([]byte, 5) // shorter than the prefix: truncated like snprintf
	FillPing(b, 7)
	if string(b) != "rdma\x00" {
		t.Fatalf("%q", b)
	}
	FillPing(nil, 1)
	// The start letter cycles through 58 letters.
	x, y := make([]byte, 64), make([]byte, 64)
	FillPing(x, 0)
	FillPing(y, 58)
	if x[len("rdma-ping-0: ")] != 'A' || y[len("rdma-ping-58: ")] != 'A' || y[len("rdma-ping-58: ")+1] != 'B' {
		t.Fatalf("%q / %q", x, y)
	}
	if WriteLen([]byte("ab\x00cd")) != 3 || WriteLen([]byte("abc")) != 3 {
		t.Fatal("WriteLen")
	}
}

func TestHostileMessages(t *testing.T) {
	var s Server
	s.Buf = make([]byte, 64)
	if _, err := s.OnRecv(make([]byte, 15)); err == nil {
		t.Fatal("15-byte message accepted")
	}
	big := Info{Buf: 1, RKey: 2, Size: 65}
	var b [InfoSize]byte
	big.Encode(b[:])
	if _, err := s.OnRecv(b[:]); err == nil {
		t.Fatal("advertisement larger than our buffer accepted")
	}
	if _, err := s.OnComplete(); err == nil {
		t.Fatal("completion with nothing posted accepted")
	}
	var c Client
	if _, err := c.OnRecv(b[:]); err == nil {
		t.Fatal("go-ahead before Begin accepted")
	}
}
