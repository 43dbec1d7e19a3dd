// Package afpacket is the AF_PACKET implementation of port.Port, for hosts or
// drivers where XDP is not available: it needs only CAP_NET_RAW.
//
// A plain UDP socket cannot carry RoCEv2: the ICRC covers the IP header
// (with TTL, TOS and checksum masked), so the engine must write whole frames
// itself. A raw packet socket does that; a classic BPF socket filter makes the
// kernel hand it only RoCEv2 (UDP destination port 4791 over IPv4 or IPv6),
// and frames go in batches with recvmmsg and sendmmsg.
//
// Unlike AF_XDP this does not take RoCEv2 away from the kernel: the kernel
// also sees the frames and, with no UDP socket on 4791, may answer with ICMP
// port unreachable. Run with an nftables/iptables rule dropping inbound UDP
// 4791 (or rate-limited ICMP) when that matters. VLAN: the kernel usually
// strips the tag before packet sockets see it, so open the port on the VLAN
// interface (eth0.100), not on its parent.
package afpacket

import (
	"errors"
	"fmt"
	"net"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/port"
	"golang.org/x/sys/unix"
)

// Config describes an AF_PACKET port.
type Config struct {
	// IfIndex is the interface (in the calling thread's network namespace).
	IfIndex int
	// RcvBuf and SndBuf size the socket buffers (0: 4 MiB and 1 MiB). The
	// receive buffer is what absorbs a burst while the engine is busy.
	RcvBuf, SndBuf int
}

// Stats are the port's counters.
type Stats struct {
	Packets   uint64 // PACKET_STATISTICS tp_packets: frames that passed the filter
	Drops     uint64 // PACKET_STATISTICS tp_drops: dropped, receive buffer full
	Truncated uint64 // received frames larger than MaxFrame, dropped
	Syscalls  uint64 // recvmmsg, sendmmsg and poll calls
}

// Port is an AF_PACKET port.Port.
type Port struct {
	fd       int
	maxFrame int

	rbufs [][]byte // receive buffers, one per batch slot
	rhdrs []unix.Mmsghdr
	riov  []unix.Iovec
	shdrs []unix.Mmsghdr
	siov  []unix.Iovec
	pfd   []unix.PollFd

	// PACKET_STATISTICS resets on read; the totals accumulate here.
	packets, drops uint64
	truncated      uint64
	syscalls       uint64
	closed         bool
}

var _ port.Port = (*Port)(nil)

// roceFilter is a classic BPF program accepting Ethernet + IPv4 (any IHL, not
// a fragment) + UDP to 4791, and Ethernet + IPv6 + UDP to 4791; it drops the
// rest before it is queued to the socket.
var roceFilter = []unix.SockFilter{
	/* 0 */ {Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 12}, // ethertype
	/* 1 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, Jf: 0, K: 0x0800},
	/* 2 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 7, Jf: 12, K: 0x86dd},
	/* 3 */ {Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 23}, // IPv4 protocol
	/* 4 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 10, K: unix.IPPROTO_UDP},
	/* 5 */ {Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 20}, // flags + fragment offset
	/* 6 */ {Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, Jt: 8, Jf: 0, K: 0x3fff},
	/* 7 */ {Code: unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH, K: 14}, // X = IHL*4
	/* 8 */ {Code: unix.BPF_LD | unix.BPF_H | unix.BPF_IND, K: 14 + 2}, // UDP dport
	/* 9 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 4, Jf: 5, K: 4791},
	/* 10 */ {Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 14 + 6}, // IPv6 next header
	/* 11 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: unix.IPPROTO_UDP},
	/* 12 */ {Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 14 + 40 + 2}, // UDP dport
	/* 13 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: 4791},
	/* 14 */ {Code: unix.BPF_RET | unix.BPF_K, K: 0x40000},
	/* 15 */ {Code: unix.BPF_RET | unix.BPF_K, K: 0},
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Open creates the packet socket, attaches the RoCEv2 filter and binds it to
// the interface.
func Open(cfg Config) (p *Port, err error) {
	ifc, err := net.InterfaceByIndex(cfg.IfIndex)
	if err != nil {
		return nil, fmt.Errorf("afpacket: interface %d: %w", cfg.IfIndex, err)
	}
	if cfg.RcvBuf == 0 {
		cfg.RcvBuf = 4 << 20
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
			unix.Close(fd)
			p = nil
		}
	}()
	prog := unix.SockFprog{Len: uint16(len(roceFilter)), Filter: &roceFilter[0]}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog); err != nil {
		return nil, fmt.Errorf("afpacket: attach RoCEv2 filter: %w", err)
	}
	// Our own transmissions are not input.
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
		return nil, fmt.Errorf("afpacket: PACKET_IGNORE_OUTGOING: %w", err)
	}
	// Frames are complete and ours: skip the qdisc layer on transmit.
	_ = unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1)
	// FORCE variants exceed rmem_max when privileged; fall back if not.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, cfg.RcvBuf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, cfg.RcvBuf)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, cfg.SndBuf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, cfg.SndBuf)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: cfg.IfIndex}); err != nil {
		return nil, fmt.Errorf("afpacket: bind to %s: %w", ifc.Name, err)
	}
	p.pfd = []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	p.grow(port.BatchSize)
	return p, nil
}

// grow sizes the batch arrays for n frames (at Open and if a caller uses a
// larger batch; never per packet).
func (p *Port) grow(n int) {
	if len(p.rhdrs) >= n {
		return
	}
	p.rbufs = make([][]byte, n)
	p.rhdrs = make([]unix.Mmsghdr, n)
	p.riov = make([]unix.Iovec, n)
	p.shdrs = make([]unix.Mmsghdr, n)
	p.siov = make([]unix.Iovec, n)
	for i := range p.rbufs {
		p.rbufs[i] = make([]byte, p.maxFrame)
		p.riov[i].Base = &p.rbufs[i][0]
		p.riov[i].SetLen(p.maxFrame)
		p.rhdrs[i].Hdr.Iov = &p.riov[i]
		p.rhdrs[i].Hdr.SetIovlen(1)
		p.shdrs[i].Hdr.Iov = &p.siov[i]
		p.shdrs[i].Hdr.SetIovlen(1)
	}
}

func (p *Port) recvmmsg(n int) (int, unix.Errno) {
	p.syscalls++
	r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(p.fd), uintptr(unsafe.Pointer(&p.rhdrs[0])), uintptr(n), unix.MSG_DONTWAIT, 0, 0)
	return int(r), e
}

// Recv implements port.Port. The frames are views into the port's receive
// buffers, overwritten by the next Recv.
func (p *Port) Recv(frames [][]byte, timeout time.Duration) (int, error) {
	if p.closed {
		return 0, port.ErrClosed
	}
	if len(frames) == 0 {
		return 0, nil
	}
	p.grow(len(frames))
	want := len(frames)
	for i := 0; i < want; i++ {
		p.rhdrs[i].Hdr.Flags = 0
	}
	r, e := p.recvmmsg(want)
	if e == unix.EAGAIN && timeout > 0 {
		ms := max(int(timeout/time.Millisecond), 1)
		p.syscalls++
		if _, err := unix.Poll(p.pfd, ms); err != nil && err != unix.EINTR {
			return 0, fmt.Errorf("afpacket: poll: %w", err)
		}
		r, e = p.recvmmsg(want)
	}
	switch e {
	case 0:
	case unix.EAGAIN, unix.EINTR:
		return 0, nil
	default:
		return 0, fmt.Errorf("afpacket: recvmmsg: %w", e)
	}
	n := 0
	for i := 0; i < r; i++ {
		h := &p.rhdrs[i]
		if h.Hdr.Flags&unix.MSG_TRUNC != 0 || int(h.Len) > p.maxFrame {
			p.truncated++
			continue
		}
		frames[n] = p.rbufs[i][:h.Len:h.Len]
		n++
	}
	return n, nil
}

// Send implements port.Port. The kernel copies the frames during sendmmsg.
func (p *Port) Send(frames [][]byte) (int, error) {
	if p.closed {
		return 0, port.ErrClosed
	}
	if len(frames) == 0 {
		return 0, nil
	}
	p.grow(len(frames))
	for i, f := range frames {
		if len(f) == 0 || len(f) > p.maxFrame {
			if i == 0 {
				return 0, fmt.Errorf("afpacket: frame of %d bytes, MaxFrame %d", len(f), p.maxFrame)
			}
			frames = frames[:i] // send those before it; the caller retries the rest
			break
		}
		p.siov[i].Base = &f[0]
		p.siov[i].SetLen(len(f))
	}
	sent := 0
	for sent < len(frames) {
		p.syscalls++
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(p.fd), uintptr(unsafe.Pointer(&p.shdrs[sent])), uintptr(len(frames)-sent), unix.MSG_DONTWAIT, 0, 0)
		if e != 0 {
			if e == unix.EAGAIN || e == unix.ENOBUFS || e == unix.EINTR {
				break // back-pressure: a short count
			}
			p.clearSend(len(frames))
			return sent, fmt.Errorf("afpacket: sendmmsg: %w", e)
		}
		if r == 0 {
			break
		}
		sent += int(r)
	}
	p.clearSend(len(frames))
	return sent, nil
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
	return Stats{Packets: p.packets, Drops: p.drops, Truncated: p.truncated, Syscalls: p.syscalls}, nil
}

// Close closes the socket.
func (p *Port) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	return errors.Join(unix.Close(p.fd))
}
