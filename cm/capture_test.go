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
)

// vectorsDir holds the shared real-rxe captures (see its README).
var vectorsDir = filepath.Join("..", "..", "shared", "vectors")

// capturedMAD is one CM MAD found in a capture: a UD SEND_ONLY to QP1.
type capturedMAD struct {
	Frame    int // 1-based frame number, as Wireshark counts
	Src, Dst netip.Addr
	QKey     uint32
	SrcQP    uint32
	MAD      MAD
}

// readCMMADs returns every CM MAD of a capture, parsing Ethernet, IPv4/IPv6,
// UDP 4791, BTH and DETH by hand so that the test depends on nothing but
// the capture.
func readCMMADs(t testing.TB, name string) []capturedMAD {
	t.Helper()
	f, err := os.Open(filepath.Join(vectorsDir, name))
	if err != nil {
		t.Skipf("capture not available: %v", err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []capturedMAD
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
			ihl := int(ip[0]&15) * 4
			if ip[9] != 17 {
				continue
			}
			src = netip.AddrFrom4([4]byte(ip[12:16]))
			dst = netip.AddrFrom4([4]byte(ip[16:20]))
			udp = ip[ihl:]
		case 0x86DD:
			ip := data[14:]
			if ip[6] != 17 {
				continue
			}
			src = netip.AddrFrom16([16]byte(ip[8:24]))
			dst = netip.AddrFrom16([16]byte(ip[24:40]))
			udp = ip[40:]
		default:
			continue
		}
		if len(udp) < 8 || binary.BigEndian.Uint16(udp[2:]) != 4791 {
			continue
		}
		bth := udp[8:]
		if len(bth) < 12+8+MADSize+4 || bth[0] != 0x64 || binary.BigEndian.Uint32(bth[4:])&0xFFFFFF != GSIQPN {
			continue
		}
		deth := bth[12:]
		m, err := ParseMAD(deth[8:])
		if err != nil {
			t.Fatalf("%s frame %d: %v", name, frame, err)
		}
		out = append(out, capturedMAD{
			Frame: frame, Src: src, Dst: dst,
			QKey: binary.BigEndian.Uint32(deth), SrcQP: binary.BigEndian.Uint32(deth[4:]) & 0xFFFFFF,
			MAD: append(MAD(nil), m...),
		})
	}
	return out
}
