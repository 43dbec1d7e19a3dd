package bpf

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// load loads the program for BPF_PROG_TEST_RUN with XDP_DROP as the verdict
// for "would be steered" (no socket can be bound in a test run). A verifier
// rejection fails the test; only a missing privilege skips it.
func load(t testing.TB, filter bool) *Program {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loading an XDP program needs CAP_BPF and CAP_NET_ADMIN: run as root")
	}
	p, err := Load(Options{Queues: 4, FilterLocal: filter, missAction: XDPDrop})
	if err != nil {
		var ve *ebpf.VerifierError
		if !errors.As(err, &ve) && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTSUP)) {
			t.Skipf("no privilege to load XDP programs: %v", err)
		}
		t.Fatalf("load: %+v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func run(t *testing.T, p *Program, frame []byte) uint32 {
	t.Helper()
	// Run on a copy: the kernel may not write to our slice, but the case
	// tables share buffers.
	in := append([]byte(nil), frame...)
	v, err := p.objs.Steer.Run(&ebpf.RunOptions{Data: in})
	if err != nil {
		t.Fatalf("prog.Run(%d bytes): %v", len(frame), err)
	}
	return v
}

var (
	macA = []byte{0x02, 0, 0, 0, 0, 1}
	macB = []byte{0x02, 0, 0, 0, 0, 2}
	v4A  = netip.MustParseAddr("10.11.0.1")
	v4B  = netip.MustParseAddr("10.11.0.2")
	v6A  = netip.MustParseAddr("fd00:11::1")
	v6B  = netip.MustParseAddr("fd00:11::2")
)

const (
	protoICMP = 1
	protoTCP  = 6
	protoUDP  = 17
)

// frameOpts describe a crafted test frame.
type frameOpts struct {
	vlan    uint16 // outer TPID when non-zero (0x8100 or 0x88a8)
	v6      bool
	proto   uint8
	dport   uint16
	dst     netip.Addr // zero: the default peer
	ihl     int        // IPv4 header length in words (0: 5)
	frag    uint16     // IPv4 flags+fragment offset field
	payload int
}

// craft builds Ethernet [+VLAN] + IP + L4 header + payload.
func craft(o frameOpts) []byte {
	b := append([]byte{}, macB...)
	b = append(b, macA...)
	if o.vlan != 0 {
		b = binary.BigEndian.AppendUint16(b, o.vlan)
		b = binary.BigEndian.AppendUint16(b, 100) // VID 100
	}
	l4len := 8
	if o.proto == protoTCP {
		l4len = 20
	}
	l4len += o.payload
	if o.v6 {
		b = binary.BigEndian.AppendUint16(b, 0x86dd)
		dst := v6B
		if o.dst.IsValid() {
			dst = o.dst
		}
		b = binary.BigEndian.AppendUint32(b, 6<<28)
		b = binary.BigEndian.AppendUint16(b, uint16(l4len))
		b = append(b, o.proto, 64)
		s, d := v6A.As16(), dst.As16()
		b = append(b, s[:]...)
		b = append(b, d[:]...)
	} else {
		b = binary.BigEndian.AppendUint16(b, 0x0800)
		ihl := o.ihl
		if ihl == 0 {
			ihl = 5
		}
		dst := v4B
		if o.dst.IsValid() {
			dst = o.dst
		}
		b = append(b, byte(0x40|ihl), 0)
		b = binary.BigEndian.AppendUint16(b, uint16(ihl*4+l4len))
		b = append(b, 0, 1)
		b = binary.BigEndian.AppendUint16(b, o.frag)
		b = append(b, 64, o.proto, 0, 0)
		s, d := v4A.As4(), dst.As4()
		b = append(b, s[:]...)
		b = append(b, d[:]...)
		for i := 5; i < ihl; i++ {
			b = append(b, 1, 1, 1, 1) // NOP options
		}
	}
	switch o.proto {
	case protoUDP:
		b = binary.BigEndian.AppendUint16(b, 49152)
		b = binary.BigEndian.AppendUint16(b, o.dport)
		b = binary.BigEndian.AppendUint16(b, uint16(l4len))
		b = append(b, 0, 0)
	case protoTCP:
		b = binary.BigEndian.AppendUint16(b, 40000)
		b = binary.BigEndian.AppendUint16(b, o.dport)
		b = append(b, make([]byte, 16)...)
		b[len(b)-8] = 0x50
	case protoICMP:
		b = append(b, 8, 0, 0, 0, 0, 1, 0, 1)
	}
	for i := 0; i < o.payload; i++ {
		b = append(b, byte(i))
	}
	return b
}

func arp() []byte {
	b := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, macA...)
	b = append(b, 0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1)
	b = append(b, macA...)
	a := v4A.As4()
	b = append(b, a[:]...)
	b = append(b, 0, 0, 0, 0, 0, 0)
	a = v4B.As4()
	return append(b, a[:]...)
}

func TestVerdicts(t *testing.T) {
	p := load(t, false)
	const steer, pass = XDPDrop, XDPPass
	roce := frameOpts{proto: protoUDP, dport: 4791, payload: 12 + 16 + 4}
	with := func(f func(*frameOpts)) frameOpts { o := roce; f(&o); return o }
	cases := []struct {
		name  string
		frame []byte
		want  uint32
	}{
		{"RoCEv2/IPv4", craft(roce), steer},
		{"RoCEv2/IPv4 with options", craft(with(func(o *frameOpts) { o.ihl = 7 })), steer},
		{"RoCEv2/IPv4 IHL 15", craft(with(func(o *frameOpts) { o.ihl = 15 })), steer},
		{"RoCEv2/IPv6", craft(with(func(o *frameOpts) { o.v6 = true })), steer},
		{"RoCEv2/802.1Q/IPv4", craft(with(func(o *frameOpts) { o.vlan = 0x8100 })), steer},
		{"RoCEv2/802.1ad/IPv6", craft(with(func(o *frameOpts) { o.vlan = 0x88a8; o.v6 = true })), steer},
		{"RoCEv2 4096 MTU", craft(with(func(o *frameOpts) { o.payload = 4096 + 12 + 16 + 4 })), steer},
		{"ARP", arp(), pass},
		{"ICMP echo", craft(frameOpts{proto: protoICMP, payload: 56}), pass},
		{"ICMPv6-ish (no UDP)", craft(frameOpts{v6: true, proto: 58, payload: 8}), pass},
		{"TCP to 18515", craft(frameOpts{proto: protoTCP, dport: 18515}), pass},
		{"TCP to 4791", craft(frameOpts{proto: protoTCP, dport: 4791}), pass},
		{"UDP to 53", craft(frameOpts{proto: protoUDP, dport: 53, payload: 20}), pass},
		{"UDP/IPv6 to 4792", craft(frameOpts{v6: true, proto: protoUDP, dport: 4792}), pass},
		{"UDP/VLAN to 53", craft(frameOpts{vlan: 0x8100, proto: protoUDP, dport: 53}), pass},
		{"IPv4 fragment MF", craft(with(func(o *frameOpts) { o.frag = 0x2000 })), pass},
		{"IPv4 fragment offset", craft(with(func(o *frameOpts) { o.frag = 0x0010 })), pass},
		{"IPv4 DF", craft(with(func(o *frameOpts) { o.frag = 0x4000 })), steer},
	}
	// A corrupt IHL (below 5) must not be steered.
	bad := craft(roce)
	bad[14] = 0x44
	cases = append(cases, struct {
		name  string
		frame []byte
		want  uint32
	}{"IPv4 IHL 4", bad, pass})
	// Wrong IP version behind the IPv4 ethertype.
	bad = craft(roce)
	bad[14] = 0x65
	cases = append(cases, struct {
		name  string
		frame []byte
		want  uint32
	}{"IPv4 ethertype version 6", bad, pass})
	for _, c := range cases {
		if got := run(t, p, c.frame); got != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, got, c.want)
		}
	}
}

// TestTruncated cuts RoCEv2 frames at every length: a frame is steered only
// once the whole UDP header is present, never read out of bounds (the
// verifier guarantees that), and counted malformed when an IP or UDP header
// is cut.
func TestTruncated(t *testing.T) {
	p := load(t, false)
	bases := []struct {
		name string
		o    frameOpts
		hdr  int // bytes up to the end of the UDP header
	}{
		{"IPv4", frameOpts{proto: protoUDP, dport: 4791, payload: 32}, 14 + 20 + 8},
		{"IPv4 options", frameOpts{proto: protoUDP, dport: 4791, payload: 32, ihl: 8}, 14 + 32 + 8},
		{"IPv6", frameOpts{v6: true, proto: protoUDP, dport: 4791, payload: 32}, 14 + 40 + 8},
		{"VLAN IPv4", frameOpts{vlan: 0x8100, proto: protoUDP, dport: 4791, payload: 32}, 18 + 20 + 8},
		{"VLAN IPv6", frameOpts{vlan: 0x8100, v6: true, proto: protoUDP, dport: 4791, payload: 32}, 18 + 40 + 8},
	}
	for _, b := range bases {
		full := craft(b.o)
		for n := 0; n <= len(full); n++ {
			before, err := p.Counters()
			if err != nil {
				t.Fatal(err)
			}
			v, err := p.objs.Steer.Run(&ebpf.RunOptions{Data: append([]byte(nil), full[:n]...)})
			if n < 14 {
				// The kernel refuses test input shorter than an Ethernet
				// header; a real NIC never delivers one.
				if err == nil && v != XDPPass {
					t.Errorf("%s cut at %d: verdict %d, want an error or pass", b.name, n, v)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s cut at %d: %v", b.name, n, err)
			}
			want := uint32(XDPPass)
			if n >= b.hdr {
				want = XDPDrop
			}
			if v != want {
				t.Errorf("%s cut at %d: verdict %d, want %d", b.name, n, v, want)
			}
			after, err := p.Counters()
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case n >= b.hdr:
				if after.Unbound != before.Unbound+1 {
					t.Errorf("%s cut at %d: unbound %d -> %d", b.name, n, before.Unbound, after.Unbound)
				}
			default:
				// Cut inside the VLAN tag, IP or UDP header of a frame
				// whose ethertype promises them: malformed.
				if after.Malformed != before.Malformed+1 {
					t.Errorf("%s cut at %d: malformed %d -> %d", b.name, n, before.Malformed, after.Malformed)
				}
			}
		}
	}
}

func TestFilterLocal(t *testing.T) {
	p := load(t, true)
	if err := p.AddLocal(v4B); err != nil {
		t.Fatal(err)
	}
	if err := p.AddLocal(v6B); err != nil {
		t.Fatal(err)
	}
	roce := frameOpts{proto: protoUDP, dport: 4791, payload: 32}
	other4 := netip.MustParseAddr("10.11.0.99")
	other6 := netip.MustParseAddr("fd00:11::99")
	cases := []struct {
		name string
		o    frameOpts
		want uint32
	}{
		{"IPv4 local", roce, XDPDrop},
		{"IPv4 foreign", frameOpts{proto: protoUDP, dport: 4791, dst: other4}, XDPPass},
		{"IPv6 local", frameOpts{v6: true, proto: protoUDP, dport: 4791}, XDPDrop},
		{"IPv6 foreign", frameOpts{v6: true, proto: protoUDP, dport: 4791, dst: other6}, XDPPass},
		{"VLAN IPv4 foreign", frameOpts{vlan: 0x8100, proto: protoUDP, dport: 4791, dst: other4}, XDPPass},
	}
	before, _ := p.Counters()
	for _, c := range cases {
		if got := run(t, p, craft(c.o)); got != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, got, c.want)
		}
	}
	after, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if after.Foreign-before.Foreign != 3 || after.Unbound-before.Unbound != 2 {
		t.Errorf("counters %+v -> %+v: want 3 foreign and 2 unbound", before, after)
	}
	// Removing the address makes it foreign.
	if err := p.RemoveLocal(v4B); err != nil {
		t.Fatal(err)
	}
	if got := run(t, p, craft(roce)); got != XDPPass {
		t.Errorf("after RemoveLocal: verdict %d, want pass", got)
	}
}

// TestProductionMissIsPass: with the production miss action, RoCEv2 on a
// queue without a socket is passed to the kernel, never dropped.
func TestProductionMissIsPass(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	p, err := Load(Options{})
	if err != nil {
		t.Fatalf("load: %+v", err)
	}
	defer p.Close()
	before, _ := p.Counters()
	if got := run(t, p, craft(frameOpts{proto: protoUDP, dport: 4791, payload: 32})); got != XDPPass {
		t.Fatalf("verdict %d, want pass", got)
	}
	after, _ := p.Counters()
	if after.Unbound != before.Unbound+1 {
		t.Errorf("unbound %d -> %d", before.Unbound, after.Unbound)
	}
	if err := p.Register(p.Queues(), 0); err == nil {
		t.Error("Register outside the XSKMAP accepted")
	}
}

func TestCountersPassed(t *testing.T) {
	p := load(t, false)
	before, _ := p.Counters()
	for i := 0; i < 10; i++ {
		run(t, p, arp())
	}
	after, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if after.Passed-before.Passed != 10 {
		t.Errorf("passed %d -> %d, want +10", before.Passed, after.Passed)
	}
}
