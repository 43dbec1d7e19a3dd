package afpacket

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/port"
)

func openIn(t *testing.T, l *netnstest.Link) *Port {
	t.Helper()
	var p *Port
	if err := l.NS.Do(func() (err error) {
		p, err = Open(Config{IfIndex: l.Index})
		return err
	}); err != nil {
		t.Fatalf("open AF_PACKET port on %s: %v", l.Name, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestTransfer100k: 100 000 RoCEv2 frames of varied sizes through AF_PACKET
// ports between two namespaces, in order and byte-exact; ping and TCP work.
func TestTransfer100k(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	a := openIn(t, &pair.A)
	b := openIn(t, &pair.B)
	if got, err := pair.A.NS.Ping(pair.B.Addr, 3, 5*time.Second); err != nil || got != 3 {
		t.Fatalf("ping with the ports open: %d/3 replies, %v", got, err)
	}
	if err := netnstest.TCPCheck(pair.A.NS, pair.B.NS, pair.B.Addr.String()); err != nil {
		t.Fatalf("TCP with the ports open: %v", err)
	}
	const n = 100000
	size := func(i int) int { return 60 + (i*37)%(1514-60+1) }
	// Without XDP the veth peer queues frames on the per-CPU backlog
	// (netdev_max_backlog, 1000), which concurrent tests share: keep the
	// window well below it so the link, not the port, never drops.
	res, err := netnstest.Transfer(a, b, &pair.A, &pair.B, n, size, 128, 90*time.Second)
	t.Logf("%d frames in %v (%.0f frames/s)", res.Received, res.Elapsed, float64(res.Received)/res.Elapsed.Seconds())
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Packets < n || st.Drops != 0 {
		t.Errorf("receiver stats %+v: want %d packets, no drops", st, n)
	}
}

// TestFilter: the socket filter admits only RoCEv2 (UDP 4791 over IPv4 with
// or without options, and IPv6); UDP to other ports, TCP to 4791, IPv4
// fragments and ARP are not delivered.
func TestFilter(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	a := openIn(t, &pair.A)
	b := openIn(t, &pair.B)

	mk := func(size int, seq uint32, edit func([]byte) []byte) []byte {
		f := netnstest.RoCEFrame(make([]byte, size), &pair.A, &pair.B, seq)
		if edit != nil {
			f = edit(f)
		}
		return f
	}
	udp53 := mk(100, 1, func(f []byte) []byte { binary.BigEndian.PutUint16(f[36:], 53); return f })
	tcp := mk(100, 2, func(f []byte) []byte { f[23] = 6; return f })
	frag := mk(100, 3, func(f []byte) []byte { binary.BigEndian.PutUint16(f[20:], 0x2000); return f })
	arp := mk(100, 4, func(f []byte) []byte { binary.BigEndian.PutUint16(f[12:], 0x0806); return f })
	// IPv4 with 8 bytes of options: the UDP header moves.
	opts := mk(100, 5, func(f []byte) []byte {
		g := make([]byte, len(f)+8)
		copy(g, f[:34])
		g[14] = 0x47
		copy(g[34:], []byte{1, 1, 1, 1, 1, 1, 1, 1})
		copy(g[42:], f[34:])
		return g
	})
	// IPv6: Ethernet + 40-byte header + UDP to 4791.
	v6 := make([]byte, 14+40+8+32)
	copy(v6, pair.B.MAC)
	copy(v6[6:], pair.A.MAC)
	binary.BigEndian.PutUint16(v6[12:], 0x86dd)
	v6[14] = 0x60
	binary.BigEndian.PutUint16(v6[18:], 40)
	v6[20], v6[21] = 17, 64
	s6, d6 := pair.A.Addr6.As16(), pair.B.Addr6.As16()
	copy(v6[22:], s6[:])
	copy(v6[38:], d6[:])
	binary.BigEndian.PutUint16(v6[56:], 4791)
	v6[70] = 0xab
	roce := mk(120, 6, nil)

	in := [][]byte{udp53, tcp, frag, arp, opts, v6, roce}
	if k, err := port.Send(a, in); err != nil || k != len(in) {
		t.Fatalf("Send: %d, %v", k, err)
	}
	wantLens := map[int]bool{len(opts): true, len(v6): true, len(roce): true}
	got := 0
	frames := make([][]byte, port.BatchSize)
	for tries := 0; tries < 50 && got < len(wantLens); tries++ {
		k, err := b.Recv(frames, 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range frames[:k] {
			if !wantLens[len(f)] {
				t.Errorf("filter let through a %d-byte frame: % x", len(f), f[:min(len(f), 48)])
				continue
			}
			got++
		}
	}
	if got != len(wantLens) {
		t.Fatalf("received %d RoCEv2 frames, want %d", got, len(wantLens))
	}
	// Nothing else arrives later.
	if k, _ := b.Recv(frames, 100*time.Millisecond); k != 0 {
		t.Errorf("%d more frames arrived: % x", k, frames[0][:min(len(frames[0]), 48)])
	}
}

func TestRecvSendAllocs(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	a := openIn(t, &pair.A)
	b := openIn(t, &pair.B)
	frames := make([][]byte, port.BatchSize)
	out := make([][]byte, 16)
	for i := range out {
		out[i] = netnstest.RoCEFrame(make([]byte, 128), &pair.A, &pair.B, uint32(i))
	}
	received := 0
	var c port.Copier
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := c.Send(a, out); err != nil {
			t.Fatal(err)
		}
		k, _ := b.Recv(frames, time.Millisecond)
		received += k
	})
	if allocs != 0 {
		t.Errorf("Lend+Submit+Recv allocate %.1f times per batch, want 0", allocs)
	}
	if received == 0 {
		t.Error("nothing received: the allocation count measured an idle path")
	}
}

func TestOversizeAndClosed(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	a := openIn(t, &pair.A)
	if _, err := port.Send(a, [][]byte{make([]byte, a.MaxFrame()+1)}); err == nil {
		t.Error("oversize frame accepted")
	}
	bufs := make([][]byte, 2)
	if a.Lend(bufs) != 2 || len(bufs[0]) != a.MaxFrame() {
		t.Fatalf("Lend: %d-byte buffers, MaxFrame %d", len(bufs[0]), a.MaxFrame())
	}
	if n, err := a.Submit([][]byte{bufs[0][:0], make([]byte, 60)}); n != 1 || !errors.Is(err, port.ErrNotLent) {
		t.Errorf("Submit of a buffer it did not lend: %d, %v", n, err)
	}
	if n, err := a.Submit([][]byte{bufs[0][:0]}); n != 0 || !errors.Is(err, port.ErrNotLent) {
		t.Errorf("Submit of a buffer given back already: %d, %v", n, err)
	}
	a.Close()
	if _, err := a.Recv(make([][]byte, 1), 0); !errors.Is(err, port.ErrClosed) {
		t.Errorf("Recv after Close: %v", err)
	}
	if _, err := port.Send(a, [][]byte{make([]byte, 60)}); !errors.Is(err, port.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
}

// TestVLANTagKept: the kernel strips an 802.1Q tag before packet sockets see
// the frame; the port puts it back (priority bits included, which PFC and
// DCQCN depend on), so the frame is received as it was sent.
func TestVLANTagKept(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	a := openIn(t, &pair.A)
	b := openIn(t, &pair.B)
	plain := netnstest.RoCEFrame(make([]byte, 200), &pair.A, &pair.B, 7)
	tagged := make([]byte, 0, len(plain)+4)
	tagged = append(tagged, plain[:12]...)
	tagged = append(tagged, 0x81, 0x00, 0x60, 0x64) // PCP 3, VID 100
	tagged = append(tagged, plain[12:]...)
	if k, err := port.Send(a, [][]byte{tagged, plain}); k != 2 || err != nil {
		t.Fatalf("Send: %d, %v", k, err)
	}
	frames := make([][]byte, port.BatchSize)
	var got [][]byte
	for tries := 0; tries < 50 && len(got) < 2; tries++ {
		k, err := b.Recv(frames, 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range frames[:k] {
			got = append(got, append([]byte(nil), f...))
		}
	}
	if len(got) != 2 {
		t.Fatalf("received %d frames, want 2", len(got))
	}
	if !bytes.Equal(got[0], tagged) {
		t.Errorf("tagged frame received as % x\nwant % x", got[0][:20], tagged[:20])
	}
	if !bytes.Equal(got[1], plain) {
		t.Errorf("untagged frame received as % x", got[1][:20])
	}
	if st, _ := b.Stats(); st.VLAN != 1 {
		t.Errorf("VLAN counter %d, want 1", st.VLAN)
	}
}

// isRoCE is the steering rule in plain Go (as in package bpf's fuzz test):
// Ethernet, at most one 802.1Q/802.1ad tag, IPv4 (version 4, IHL >= 5, not a
// fragment) or IPv6 (version 6, UDP next), UDP destination port 4791.
func isRoCE(f []byte) bool {
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
		if len(f) < l3+20 || f[l3]>>4 != 4 || f[l3]&0x0f < 5 || f[l3+9] != 17 || binary.BigEndian.Uint16(f[l3+6:])&0x3fff != 0 {
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

// TestFilterDifferential sends frames with random mutations of the bytes the
// filter looks at and checks that exactly those the rule accepts arrive,
// unchanged (VLAN tags included).
func TestFilterDifferential(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	a := openIn(t, &pair.A)
	b := openIn(t, &pair.B)
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 3000
	want := map[uint32][]byte{}
	frames := make([][]byte, port.BatchSize)
	got := map[uint32][]byte{}
	drain := func(wait time.Duration) {
		for {
			k, err := b.Recv(frames, wait)
			if err != nil {
				t.Fatal(err)
			}
			if k == 0 {
				return
			}
			for _, f := range frames[:k] {
				got[binary.BigEndian.Uint32(f[len(f)-4:])] = append([]byte(nil), f...)
			}
		}
	}
	batch := make([][]byte, 0, 32)
	for i := uint32(0); i < n; i++ {
		size := 64 + rng.IntN(80)
		f := netnstest.RoCEFrame(make([]byte, size), &pair.A, &pair.B, i)
		switch rng.IntN(4) {
		case 1: // tagged
			f = append(append(append([]byte{}, f[:12]...), 0x81, 0x00, byte(rng.IntN(8)<<5), 100), f[12:]...)
		case 2: // IPv6
			g := make([]byte, 14+40+8+rng.IntN(40)+8)
			copy(g, f[:12])
			binary.BigEndian.PutUint16(g[12:], 0x86dd)
			g[14], g[20] = 0x60, 17
			binary.BigEndian.PutUint16(g[14+40+2:], 4791)
			f = g
		case 3: // IPv4 options
			ihl := 5 + rng.IntN(11)
			g := make([]byte, 14+ihl*4+8+rng.IntN(40)+8)
			copy(g, f[:34])
			g[14] = byte(0x40 | ihl)
			binary.BigEndian.PutUint16(g[14+ihl*4+2:], 4791)
			f = g
		}
		// Mutate up to three header bytes (never the MACs or the id).
		for m := rng.IntN(5); m > 0; m-- {
			off := 12 + rng.IntN(min(len(f)-4, 14+60+8)-12)
			switch rng.IntN(3) {
			case 0:
				f[off] = byte(rng.IntN(256))
			case 1:
				f[off] ^= 1 << rng.IntN(8)
			default:
				f[off] = []byte{0x08, 0x00, 0x86, 0xdd, 0x81, 0x45, 0x60, 17, 6, 0x12, 0xb7, 0x20}[rng.IntN(12)]
			}
		}
		binary.BigEndian.PutUint32(f[len(f)-4:], i)
		if isRoCE(f) {
			want[i] = f
		}
		batch = append(batch, f)
		if len(batch) == cap(batch) || i == n-1 {
			if k, err := port.Send(a, batch); err != nil || k != len(batch) {
				t.Fatalf("Send: %d of %d, %v", k, len(batch), err)
			}
			batch = batch[:0]
			drain(time.Millisecond)
		}
	}
	drain(50 * time.Millisecond)
	if len(want) < n/5 || len(want) > n-n/10 {
		t.Fatalf("the mutations left %d of %d frames acceptable: not a useful mix", len(want), n)
	}
	for id, f := range want {
		g, ok := got[id]
		if !ok {
			t.Errorf("frame %d accepted by the rule but not delivered: % x", id, f[:min(len(f), 60)])
		} else if !bytes.Equal(f, g) {
			t.Errorf("frame %d changed: % x\nwant % x", id, g[:min(len(g), 40)], f[:min(len(f), 40)])
		}
	}
	for id, g := range got {
		if _, ok := want[id]; !ok {
			t.Errorf("frame %d rejected by the rule but delivered: % x", id, g[:min(len(g), 60)])
		}
	}
	t.Logf("%d frames, %d RoCEv2 by the rule, %d delivered", n, len(want), len(got))
}

// TestIdleRecvAllocs: waiting on an idle port (the engine's idle loop, with
// sub-millisecond timeouts) does not allocate.
func TestIdleRecvAllocs(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	b := openIn(t, &pair.B)
	frames := make([][]byte, port.BatchSize)
	if allocs := testing.AllocsPerRun(50, func() { _, _ = b.Recv(frames, 50*time.Microsecond) }); allocs != 0 {
		t.Errorf("idle Recv allocates %.1f times, want 0", allocs)
	}
	if st, _ := b.Stats(); st.Syscalls == 0 {
		t.Error("no poll happened: the idle path was not measured")
	}
}
