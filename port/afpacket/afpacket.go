package afpacket

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/softrnic/softrnic/port"
	"golang.org/x/sys/unix"
)

// Config describes an AF_PACKET port.
type Config struct {
	// IfIndex is the interface (in the calling thread's network namespace).
	IfIndex int
	// RingBytes sizes the receive ring (0: 8 MiB), which is what absorbs a
	// burst while the engine is busy.
	RingBytes int
	// SndBuf sizes the socket's send buffer (0: 1 MiB).
	SndBuf int
}

// Stats are the port's counters.
type Stats struct {
	Packets   uint64 // PACKET_STATISTICS tp_packets: frames that passed the filter
	Drops     uint64 // PACKET_STATISTICS tp_drops: dropped, receive ring full
	Truncated uint64 // received frames larger than a ring slot (or with a bad header), dropped
	VLAN      uint64 // received frames whose stripped 802.1Q tag was put back
	Syscalls  uint64 // sendmmsg and poll calls
}

// Port is an AF_PACKET port.Port.
type Port struct {
	fd       int
	maxFrame int

	// The receive ring: nslots slots of slotSize bytes, each starting with
	// a tpacket2_hdr whose status word says who owns the slot. next is the
	// slot to look at; the lent slots from lentFrom were handed out by the
	// last Recv and go back to the kernel at the next one.
	ring     []byte
	slotSize int
	nslots   int
	next     int
	lentFrom int
	lent     int

	// Transmit buffers (Lend): txN of maxFrame bytes in txSlab, the free
	// ones stacked in txFree, the lent ones marked in txLent. The kernel
	// copies a frame out of its buffer during sendmmsg.
	txSlab []byte
	txFree []int32
	txLent []bool

	shdrs []unix.Mmsghdr
	siov  []unix.Iovec
	pfd   []unix.PollFd
	ts    unix.Timespec // Recv's timeout, kept here so Ppoll does not allocate

	// PACKET_STATISTICS resets on read; the totals accumulate here.
	packets, drops uint64
	truncated      uint64
	vlan           uint64
	syscalls       uint64
	wake           *port.Wakeup // Waker: polled beside the socket
	closed         bool
}

var (
	_ port.Port  = (*Port)(nil)
	_ port.Waker = (*Port)(nil)
)

// roceFilter is a classic BPF program accepting Ethernet + IPv4 (version 4,
// IHL at least 5, not a fragment) + UDP to 4791, and Ethernet + IPv6
// (version 6) + UDP to 4791; it drops the rest before it is queued to the
// socket. It is the XDP steering program's rule (package bpf), minus the VLAN
// tag, which the kernel has already taken out when packet sockets see a frame.
// A load beyond the end of the frame makes the kernel drop it, so truncated
// headers never pass.
var roceFilter = assemble([]insn{
	{op: ldh, k: 12}, // ethertype
	{op: jeq, k: 0x0800, jt: "v4"},
	{op: jeq, k: 0x86dd, jt: "v6", jf: "drop"},
	{label: "v4", op: ldb, k: 14}, // version and IHL
	{op: and, k: 0xf0},
	{op: jeq, k: 0x40, jf: "drop"},
	{op: ldb, k: 14},
	{op: and, k: 0x0f},
	{op: jge, k: 5, jf: "drop"},
	{op: ldb, k: 14 + 9}, // protocol
	{op: jeq, k: unix.IPPROTO_UDP, jf: "drop"},
	{op: ldh, k: 14 + 6}, // flags and fragment offset
	{op: jset, k: 0x3fff, jt: "drop"},
	{op: ldxmsh, k: 14},   // X = IHL*4
	{op: ldhx, k: 14 + 2}, // UDP destination port
	{op: jeq, k: 4791, jt: "accept", jf: "drop"},
	{label: "v6", op: ldb, k: 14}, // version
	{op: and, k: 0xf0},
	{op: jeq, k: 0x60, jf: "drop"},
	{op: ldb, k: 14 + 6}, // next header
	{op: jeq, k: unix.IPPROTO_UDP, jf: "drop"},
	{op: ldh, k: 14 + 40 + 2}, // UDP destination port
	{op: jeq, k: 4791, jt: "accept", jf: "drop"},
	{label: "accept", op: ret, k: 0x40000},
	{label: "drop", op: ret, k: 0},
})

// insn is a classic BPF instruction with symbolic jump targets (an empty
// target is the next instruction), so the filter reads as a listing and no
// jump offset is counted by hand.
type insn struct {
	label  string
	op     uint16
	k      uint32
	jt, jf string
}

const (
	ldh    = unix.BPF_LD | unix.BPF_H | unix.BPF_ABS
	ldb    = unix.BPF_LD | unix.BPF_B | unix.BPF_ABS
	ldhx   = unix.BPF_LD | unix.BPF_H | unix.BPF_IND
	ldxmsh = unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH
	and    = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
	jeq    = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	jge    = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	jset   = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	ret    = unix.BPF_RET | unix.BPF_K
)

// assemble resolves the labels; it panics on a bad listing, which is a
// programming error caught by any test that opens a port.
func assemble(prog []insn) []unix.SockFilter {
	at := map[string]int{}
	for i, in := range prog {
		if in.label != "" {
			at[in.label] = i
		}
	}
	off := func(i int, target string) uint8 {
		if target == "" {
			return 0
		}
		t, ok := at[target]
		if !ok || t <= i || t-i-1 > 255 {
			panic("afpacket: bad filter jump to " + target)
		}
		return uint8(t - i - 1)
	}
	out := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		out[i] = unix.SockFilter{Code: in.op, K: in.k}
		if in.op&0x07 == unix.BPF_JMP {
			out[i].Jt, out[i].Jf = off(i, in.jt), off(i, in.jf)
		}
	}
	return out
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// vlanRoom is the headroom reserved in each ring slot for putting a tag back.
const vlanRoom = 4

// txBuffers is how many transmit buffers the port lends: two batches, so
// that frames held back by a full send buffer leave room for the next.
const txBuffers = 2 * port.BatchSize

// Open creates the packet socket, attaches the RoCEv2 filter, maps the
// receive ring and binds to the interface.
func Open(cfg Config) (p *Port, err error) {
	ifc, err := net.InterfaceByIndex(cfg.IfIndex)
	if err != nil {
		return nil, fmt.Errorf("afpacket: interface %d: %w", cfg.IfIndex, err)
	}
	if cfg.RingBytes == 0 {
		cfg.RingBytes = 8 << 20
	}
	if cfg.SndBuf == 0 {
		cfg.SndBuf = 1 << 20
	}
	// Protocol 0: receive nothing until the filter is in place and bind
	// names the protocol, so no unfiltered frame is ever queued.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("afpacket: socket: %w", err)
	}
	p = &Port{fd: fd, maxFrame: ifc.MTU + 14 + 4}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.Close())
			p = nil
		}
	}()
	prog := unix.SockFprog{Len: uint16(len(roceFilter)), Filter: &roceFilter[0]}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog); err != nil {
		return p, fmt.Errorf("afpacket: attach RoCEv2 filter: %w", err)
	}
	// Our own transmissions are not input.
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
		return p, fmt.Errorf("afpacket: PACKET_IGNORE_OUTGOING: %w", err)
	}
	// Frames are complete and ours: skip the qdisc layer on transmit.
	_ = unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1)
	// The FORCE variant may exceed wmem_max when privileged; fall back.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, cfg.SndBuf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, cfg.SndBuf)
	}
	if err := p.setupRing(cfg.RingBytes); err != nil {
		return p, err
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: cfg.IfIndex}); err != nil {
		return p, fmt.Errorf("afpacket: bind to %s: %w", ifc.Name, err)
	}
	if p.wake, err = port.NewWakeup(); err != nil {
		return p, fmt.Errorf("afpacket: %w", err)
	}
	p.pfd = []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(p.wake.FD()), Events: unix.POLLIN}}
	p.grow(port.BatchSize)
	p.txSlab = make([]byte, txBuffers*p.maxFrame)
	p.txLent = make([]bool, txBuffers)
	for i := txBuffers - 1; i >= 0; i-- {
		p.txFree = append(p.txFree, int32(i))
	}
	return p, nil
}

// Wake implements port.Waker.
func (p *Port) Wake() error { return p.wake.Wake() }

// setupRing maps a TPACKET_V2 receive ring of about ringBytes.
func (p *Port) setupRing(ringBytes int) error {
	if err := unix.SetsockoptInt(p.fd, unix.SOL_PACKET, unix.PACKET_VERSION, unix.TPACKET_V2); err != nil {
		return fmt.Errorf("afpacket: TPACKET_V2: %w", err)
	}
	if err := unix.SetsockoptInt(p.fd, unix.SOL_PACKET, unix.PACKET_RESERVE, vlanRoom); err != nil {
		return fmt.Errorf("afpacket: PACKET_RESERVE: %w", err)
	}
	// A slot holds the header, a sockaddr_ll, the reserve and the frame
	// (the kernel puts the MAC header near 66 bytes + reserve). Slots are a
	// power of two so that they tile the blocks exactly.
	need := 128 + vlanRoom + p.maxFrame
	slot := 2048
	for slot < need {
		slot *= 2
	}
	block := max(slot, 1<<17)
	nblocks := max(ringBytes/block, 4)
	req := unix.TpacketReq{Block_size: uint32(block), Block_nr: uint32(nblocks), Frame_size: uint32(slot), Frame_nr: uint32(nblocks * (block / slot))}
	if err := unix.SetsockoptTpacketReq(p.fd, unix.SOL_PACKET, unix.PACKET_RX_RING, &req); err != nil {
		return fmt.Errorf("afpacket: PACKET_RX_RING %+v: %w", req, err)
	}
	ring, err := unix.Mmap(p.fd, 0, block*nblocks, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("afpacket: mmap ring: %w", err)
	}
	p.ring, p.slotSize, p.nslots = ring, slot, int(req.Frame_nr)
	return nil
}

// grow sizes the send arrays for n frames (at Open and if a caller uses a
// larger batch; never per packet).
func (p *Port) grow(n int) {
	if len(p.shdrs) >= n {
		return
	}
	p.shdrs = make([]unix.Mmsghdr, n)
	p.siov = make([]unix.Iovec, n)
	for i := range p.shdrs {
		p.shdrs[i].Hdr.Iov = &p.siov[i]
		p.shdrs[i].Hdr.SetIovlen(1)
	}
}

// release gives the slots lent by the last Recv back to the kernel.
func (p *Port) release() {
	for i := 0; i < p.lent; i++ {
		status(p.slot((p.lentFrom + i) % p.nslots)).Store(unix.TP_STATUS_KERNEL)
	}
	p.lent = 0
}

// Recv implements port.Port. The frames are views into the receive ring;
// their slots go back to the kernel at the next Recv.
func (p *Port) Recv(frames [][]byte, timeout time.Duration) (int, error) {
	if p.closed {
		return 0, port.ErrClosed
	}
	p.release()
	if len(frames) == 0 {
		return 0, nil
	}
	n := p.collect(frames)
	if n == 0 && p.lent == 0 && timeout > 0 {
		// ppoll keeps sub-millisecond timeouts; the timespec lives in the
		// Port so that the call does not allocate.
		p.ts = unix.NsecToTimespec(int64(timeout))
		p.syscalls++
		p.pfd[1].Revents = 0
		if _, err := unix.Ppoll(p.pfd, &p.ts, nil); err != nil && err != unix.EINTR {
			return 0, fmt.Errorf("afpacket: poll: %w", err)
		}
		if p.pfd[1].Revents != 0 {
			p.wake.Drain()
		}
		n = p.collect(frames)
	}
	return n, nil
}

// collect takes, in ring order, the frames the kernel has handed over.
func (p *Port) collect(frames [][]byte) int {
	if p.lent == 0 {
		p.lentFrom = p.next
	}
	n := 0
	for n < len(frames) && p.lent < p.nslots {
		h := p.slot(p.next)
		st := status(h).Load()
		if st&unix.TP_STATUS_USER == 0 {
			break
		}
		base := p.next * p.slotSize
		p.next = (p.next + 1) % p.nslots
		p.lent++ // returned at the next Recv, whether used or dropped
		mac, snap := int(h.Mac), int(h.Snaplen)
		if st&unix.TP_STATUS_COPY != 0 || snap != int(h.Len) || snap < 14 ||
			mac < unix.SizeofTpacket2Hdr+vlanRoom || mac+snap > p.slotSize {
			p.truncated++ // larger than a slot, or a header we cannot trust
			continue
		}
		f := p.ring[base+mac : base+mac+snap : base+mac+snap]
		if st&unix.TP_STATUS_VLAN_VALID != 0 {
			// Put the stripped tag back between the MAC addresses and
			// the ethertype, in the reserved headroom.
			tpid := uint16(0x8100)
			if st&unix.TP_STATUS_VLAN_TPID_VALID != 0 && h.Vlan_tpid != 0 {
				tpid = h.Vlan_tpid
			}
			g := p.ring[base+mac-vlanRoom : base+mac+snap : base+mac+snap]
			copy(g[0:12], f[0:12])
			g[12], g[13] = byte(tpid>>8), byte(tpid)
			g[14], g[15] = byte(h.Vlan_tci>>8), byte(h.Vlan_tci)
			f = g
			p.vlan++
		}
		frames[n] = f
		n++
	}
	return n
}

// Lend implements port.Port: the buffers are the port's own, from which
// sendmmsg copies.
func (p *Port) Lend(bufs [][]byte) int {
	if p.closed {
		return 0
	}
	n := min(len(bufs), len(p.txFree))
	for i := 0; i < n; i++ {
		k := p.txFree[len(p.txFree)-1]
		p.txFree = p.txFree[:len(p.txFree)-1]
		p.txLent[k] = true
		a := int(k) * p.maxFrame
		bufs[i] = p.txSlab[a : a+p.maxFrame : a+p.maxFrame]
	}
	return n
}

// Submit implements port.Port. The kernel copies the frames during
// sendmmsg; a full send buffer (EAGAIN, ENOBUFS) leaves the rest lent.
func (p *Port) Submit(frames [][]byte) (int, error) {
	if p.closed {
		return 0, port.ErrClosed
	}
	if len(frames) == 0 {
		return 0, nil
	}
	p.grow(len(frames))
	valid, m := len(frames), 0
	var err error
	for i, f := range frames {
		k, ok := p.bufOf(f)
		if !ok || !p.txLent[k] {
			valid, err = i, fmt.Errorf("afpacket: frame %d: %w", i, port.ErrNotLent)
			break
		}
		if len(f) > 0 {
			p.siov[m].Base = &f[0]
			p.siov[m].SetLen(len(f))
			m++
		}
	}
	sent := 0
	for sent < m {
		p.syscalls++
		r, e := sendmmsg(p.fd, p.shdrs[sent:m])
		if e != 0 {
			if e == unix.EAGAIN || e == unix.ENOBUFS || e == unix.EINTR {
				break // back-pressure: a short count
			}
			err = fmt.Errorf("afpacket: sendmmsg: %w", e)
			break
		}
		if r == 0 {
			break
		}
		sent += r
	}
	p.clearSend(m)
	// The frames taken: every empty one and every sent one up to the first
	// that was not sent.
	taken, j := 0, 0
	for _, f := range frames[:valid] {
		if len(f) > 0 {
			if j == sent {
				break
			}
			j++
		}
		k, _ := p.bufOf(f)
		p.txLent[k] = false
		p.txFree = append(p.txFree, k)
		taken++
	}
	return taken, err
}

// clearSend drops the references to the caller's buffers.
func (p *Port) clearSend(n int) {
	for i := 0; i < n; i++ {
		p.siov[i].Base = nil
	}
}

// MaxFrame implements port.Port: the MTU plus Ethernet and one VLAN tag.
func (p *Port) MaxFrame() int { return p.maxFrame }

// Stats reads PACKET_STATISTICS (which resets it; the port keeps totals).
// Like every Port method it belongs to the goroutine that owns the port.
func (p *Port) Stats() (Stats, error) {
	if p.closed {
		return Stats{}, port.ErrClosed
	}
	st, err := unix.GetsockoptTpacketStats(p.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	if err != nil {
		return Stats{}, fmt.Errorf("afpacket: PACKET_STATISTICS: %w", err)
	}
	p.packets += uint64(st.Packets)
	p.drops += uint64(st.Drops)
	return Stats{Packets: p.packets, Drops: p.drops, Truncated: p.truncated, VLAN: p.vlan, Syscalls: p.syscalls}, nil
}

// Close closes the socket and unmaps the ring.
func (p *Port) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	err := errors.Join(unix.Close(p.fd), p.wake.Close())
	if p.ring != nil {
		err = errors.Join(err, unix.Munmap(p.ring))
		p.ring = nil
	}
	return err
}
