package checker

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
)

// recorder is a testing.TB whose Fatalf records the message and stops the
// assertion, as the real one stops the test.
type recorder struct {
	testing.TB
	msg string
}

type stop struct{}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	panic(stop{})
}

// failure runs f against a recorder and returns what it failed with ("" if
// it passed).
func failure(f func(tb testing.TB)) (msg string) {
	r := &recorder{}
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(stop); !ok {
				panic(v)
			}
			msg = r.msg
		}
	}()
	f(r)
	return ""
}

// ackPacket is an RC ACKNOWLEDGE to QP 0x22, PSN 7, syndrome 0x1F, MSN 3.
func ackPacket() []byte {
	b := make([]byte, bth.BTHLen+bth.AETHLen)
	bth.BTH(b).Encode(&bth.BTHFields{Opcode: bth.RCAcknowledge, PKey: 0xFFFF, DestQP: 0x22, PSN: 7})
	bth.AETH(b[bth.BTHLen:]).Encode(0x1F, 3)
	return b
}

func TestTransport(t *testing.T) {
	b := ackPacket()
	p := Transport(t, b, Opcode(bth.RCAcknowledge), PSN(7), DestQP(0x22), AETH(0x1F, 3), AckReq(false), PayloadLen(0))
	if p.Op != bth.RCAcknowledge || !p.HasAETH || len(p.Raw) != len(b) {
		t.Fatalf("decoded %+v", p)
	}
	b[0] = 0xFF // the packet is a copy
	if p.Raw[0] == 0xFF {
		t.Fatal("Decode kept the caller's buffer")
	}
	for _, c := range []struct {
		name  string
		check Check
		want  string
	}{
		{"opcode", Opcode(bth.RCSendOnly), "opcode"},
		{"PSN", PSN(8), "PSN 7, want 8"},
		{"QP", DestQP(0x23), "DestQP 0x22, want 0x23"},
		{"AETH", AETH(0x1F, 4), "MSN 3, want 0x1f 4"},
		{"AckReq", AckReq(true), "AckReq false, want true"},
		{"payload", Payload([]byte{1}), "payload of 0 bytes"},
	} {
		msg := failure(func(tb testing.TB) { Transport(tb, ackPacket(), c.check) })
		if !strings.Contains(msg, c.want) || !strings.Contains(msg, "ACKNOWLEDGE psn=7") {
			t.Errorf("%s: failed with %q, want it to say %q and show the packet", c.name, msg, c.want)
		}
	}
}

func TestPackets(t *testing.T) {
	got := []Packet{Decode(ackPacket()), Decode(ackPacket())}
	ack := Is(Opcode(bth.RCAcknowledge), PSN(7))
	if msg := failure(func(tb testing.TB) { Packets(tb, got, ack, ack) }); msg != "" {
		t.Fatalf("a matching sequence failed: %s", msg)
	}
	if msg := failure(func(tb testing.TB) { Packets(tb, got, ack) }); !strings.Contains(msg, "got 2 packets") {
		t.Fatalf("a longer sequence: %q", msg)
	}
	if msg := failure(func(tb testing.TB) { Packets(tb, got, ack, Is(PSN(9))) }); !strings.Contains(msg, "packet 1") {
		t.Fatalf("a wrong second packet: %q", msg)
	}
}

func TestFrame(t *testing.T) {
	src, dst := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	h := frame.Spec{SrcMAC: [6]byte{2}, DstMAC: [6]byte{2, 0, 0, 0, 0, 2}, Src: src, Dst: dst, TOS: 0x62, TTL: 64, SrcPort: 49152,
		BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: 0x22, PSN: 5, AckReq: true}}
	buf := make([]byte, 200)
	var b frame.Builder
	hl, err := b.Headers(buf, &h)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf[hl:], "hello")
	n, err := b.Finish(buf, 5)
	if err != nil {
		t.Fatal(err)
	}
	f := buf[:n]
	Frame(t, f, Src(src), Dst(dst), ECN(frame.ECT0), TrafficClass(0x62), UDPSrcPort(49152),
		TransportIs(Opcode(bth.RCSendOnly), PSN(5), AckReq(true), Payload([]byte("hello"))))
	if msg := failure(func(tb testing.TB) { Frame(tb, f, Dst(src), TransportIs(PSN(6))) }); !strings.Contains(msg, "destination 10.0.0.2, want 10.0.0.1") || !strings.Contains(msg, "PSN 5, want 6") {
		t.Fatalf("a frame to the wrong place: %q", msg)
	}
	f[len(f)-1] ^= 1
	if msg := failure(func(tb testing.TB) { Frame(tb, f) }); !strings.Contains(msg, "bad ICRC") {
		t.Fatalf("a frame with a bad ICRC: %q", msg)
	}
}
