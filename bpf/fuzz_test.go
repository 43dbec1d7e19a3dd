package bpf

import (
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf"
)

// reference is the steering rule written plainly in Go, independent of the
// C: true when the frame is to be steered. Differential fuzzing holds the
// program to it.
func reference(f []byte) bool {
	if len(f) < 14 {
		return false
	}
	proto := binary.BigEndian.Uint16(f[12:])
	l3 := 14
	if proto == 0x8100 || proto == 0x88a8 {
		if len(f) < 18 {
			return false
		}
		proto = binary.BigEndian.Uint16(f[16:])
		l3 = 18
	}
	var udp int
	switch proto {
	case 0x0800:
		if len(f) < l3+20 || f[l3]>>4 != 4 || f[l3]&0x0f < 5 {
			return false
		}
		if f[l3+9] != 17 || binary.BigEndian.Uint16(f[l3+6:])&0x3fff != 0 {
			return false
		}
		udp = l3 + int(f[l3]&0x0f)*4
	case 0x86dd:
		if len(f) < l3+40 || f[l3]>>4 != 6 || f[l3+6] != 17 {
			return false
		}
		udp = l3 + 40
	default:
		return false
	}
	return len(f) >= udp+8 && binary.BigEndian.Uint16(f[udp+2:]) == 4791
}

// FuzzSteer runs the loaded program on arbitrary frames and compares its
// verdict with reference. Needs root; skips otherwise.
func FuzzSteer(f *testing.F) {
	roce := frameOpts{proto: protoUDP, dport: 4791, payload: 32}
	for _, o := range []frameOpts{
		roce,
		{proto: protoUDP, dport: 4791, ihl: 6},
		{v6: true, proto: protoUDP, dport: 4791},
		{vlan: 0x8100, proto: protoUDP, dport: 4791},
		{vlan: 0x88a8, v6: true, proto: protoUDP, dport: 4791},
		{proto: protoTCP, dport: 18515},
		{proto: protoUDP, dport: 4791, frag: 0x2000},
		{proto: protoICMP},
	} {
		f.Add(craft(o))
	}
	f.Add(arp())
	p := load(f, false)
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 || len(frame) > 4096 {
			return // the kernel refuses test input outside these bounds
		}
		v, err := p.objs.Steer.Run(&ebpf.RunOptions{Data: append([]byte(nil), frame...)})
		if err != nil {
			t.Fatalf("prog.Run: %v", err)
		}
		want := uint32(XDPPass)
		if reference(frame) {
			want = XDPDrop // "steered" in test mode
		}
		if v != want {
			t.Fatalf("verdict %d, reference %d for % x", v, want, frame[:min(len(frame), 80)])
		}
	})
}
