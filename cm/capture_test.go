package cm

import (
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame/frametest"
)

// capturedMAD is one CM MAD found in a capture: a UD SEND_ONLY to QP1.
type capturedMAD struct {
	Frame    int // 1-based frame number, as Wireshark counts
	Src, Dst netip.Addr
	QKey     uint32
	SrcQP    uint32
	MAD      MAD
}

// roceFrame is one RoCEv2 packet of a capture: its IP addresses and its
// BTH and what follows it (up to the ICRC).
type roceFrame struct {
	Frame    int // 1-based frame number, as Wireshark counts
	Src, Dst netip.Addr
	BTH      []byte
}

// readRoCEFrames returns every UDP/4791 packet of a capture, parsing
// Ethernet, IPv4/IPv6 and UDP by hand so that the test depends on nothing
// but the capture.
func readRoCEFrames(t testing.TB, name string) []roceFrame {
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
	var out []roceFrame
	for frame := 1; ; frame++ {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(data) < 14 {
			continue
		}
		var src, dst netip.Addr
		var udp []byte
		switch binary.BigEndian.Uint16(data[12:]) {
		case 0x0800:
			ip := data[14:]
			if len(ip) < 20 {
				continue
			}
			ihl := int(ip[0]&15) * 4
			if ip[9] != 17 || len(ip) < ihl {
				continue
			}
			src = netip.AddrFrom4([4]byte(ip[12:16]))
			dst = netip.AddrFrom4([4]byte(ip[16:20]))
			udp = ip[ihl:]
		case 0x86DD:
			ip := data[14:]
			if len(ip) < 40 || ip[6] != 17 {
				continue
			}
			src = netip.AddrFrom16([16]byte(ip[8:24]))
			dst = netip.AddrFrom16([16]byte(ip[24:40]))
			udp = ip[40:]
		default:
			continue
		}
		if len(udp) < 8+12 || binary.BigEndian.Uint16(udp[2:]) != 4791 {
			continue
		}
		out = append(out, roceFrame{Frame: frame, Src: src, Dst: dst, BTH: append([]byte(nil), udp[8:]...)})
	}
	return out
}

// readCMMADs returns every CM MAD of a capture.
func readCMMADs(t testing.TB, name string) []capturedMAD {
	t.Helper()
	var out []capturedMAD
	for _, fr := range readRoCEFrames(t, name) {
		bth := fr.BTH
		if len(bth) < 12+8+MADSize+4 || bth[0] != 0x64 || binary.BigEndian.Uint32(bth[4:])&0xFFFFFF != GSIQPN {
			continue
		}
		deth := bth[12:]
		m, err := ParseMAD(deth[8:])
		if err != nil {
			t.Fatalf("%s frame %d: %v", name, fr.Frame, err)
		}
		out = append(out, capturedMAD{
			Frame: fr.Frame, Src: fr.Src, Dst: fr.Dst,
			QKey: binary.BigEndian.Uint32(deth), SrcQP: binary.BigEndian.Uint32(deth[4:]) & 0xFFFFFF,
			MAD: append(MAD(nil), m...),
		})
	}
	return out
}

// capturedConn is one RC connection of a capture: its REQ and REP and
// the PSN of the first request packet (SEND, WRITE, READ, atomic) each
// side sent on it. ACKs and READ/atomic responses are left out: they
// carry the PSN of the request they answer, from the peer's sequence.
type capturedConn struct {
	REQ                       REQ
	REP                       REP
	ActiveFirst, PassiveFirst uint32 // PSN of each side's first request
	ActiveSent, PassiveSent   bool
}

// readConns pairs each REQ of a capture with the REP that answers it and
// finds the first request packet each side sent to the other's QP.
func readConns(t testing.TB, name string) []capturedConn {
	t.Helper()
	var conns []capturedConn
	var src, dst []netip.Addr // active and passive address of each
	mads := readCMMADs(t, name)
	for i, x := range mads {
		if x.MAD.AttrID() != AttrREQ {
			continue
		}
		var c capturedConn
		c.REQ.Decode(x.MAD.Data())
		found := false
		for _, y := range mads[i+1:] {
			if y.MAD.AttrID() != AttrREP {
				continue
			}
			c.REP.Decode(y.MAD.Data())
			if c.REP.RemoteCommID == c.REQ.LocalCommID {
				found = true
				break
			}
		}
		if !found {
			t.Fatalf("%s frame %d: REQ without a REP", name, x.Frame)
		}
		conns = append(conns, c)
		src, dst = append(src, x.Src), append(dst, x.Dst)
	}
	for _, fr := range readRoCEFrames(t, name) {
		b := bth.BTH(fr.BTH)
		op := b.Opcode()
		if op.Transport() != bth.TransportRC || op.IsAck() || op.IsAtomicAck() || op.IsReadResponse() {
			continue
		}
		for k := range conns {
			c := &conns[k]
			switch {
			case !c.ActiveSent && fr.Src == src[k] && fr.Dst == dst[k] && b.DestQP() == c.REP.LocalQPN:
				c.ActiveFirst, c.ActiveSent = uint32(b.PSN()), true
			case !c.PassiveSent && fr.Src == dst[k] && fr.Dst == src[k] && b.DestQP() == c.REQ.LocalQPN:
				c.PassiveFirst, c.PassiveSent = uint32(b.PSN()), true
			}
		}
	}
	return conns
}
