package netnstest

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// Ping sends ICMP echo requests to dst (IPv4) from inside the namespace until
// want replies have come back or timeout passes, and returns how many came
// back. Echoes are re-sent rather than each required to succeed, because
// concurrent tests share the kernel's per-CPU receive backlog and a burst
// elsewhere may drop one; what is checked is that ICMP gets through. It
// exists because hosts may lack ping(8); it uses a raw socket.
func (n *NS) Ping(dst netip.Addr, want int, timeout time.Duration) (int, error) {
	if !dst.Is4() {
		return 0, fmt.Errorf("netnstest: Ping supports IPv4 only, got %v", dst)
	}
	var fd int
	if err := n.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		return err
	}); err != nil {
		return 0, fmt.Errorf("netnstest: raw ICMP socket: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, fmt.Errorf("netnstest: SO_RCVTIMEO: %w", err)
	}
	sa := &unix.SockaddrInet4{Addr: dst.As4()}
	id := uint16(time.Now().UnixNano())
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	replied := map[uint16]bool{}
	for seq := uint16(0); len(replied) < want && time.Now().Before(deadline); seq++ {
		req := make([]byte, 8+32)
		req[0] = 8 // echo request
		binary.BigEndian.PutUint16(req[4:], id)
		binary.BigEndian.PutUint16(req[6:], seq)
		for i := 8; i < len(req); i++ {
			req[i] = byte(i)
		}
		binary.BigEndian.PutUint16(req[2:], checksum(req))
		if err := unix.Sendto(fd, req, 0, sa); err != nil {
			return len(replied), fmt.Errorf("netnstest: ping send: %w", err)
		}
		// Wait up to 500 ms for this echo's reply (a late reply to an
		// earlier one counts too).
		until := time.Now().Add(500 * time.Millisecond)
		for !replied[seq] && time.Now().Before(until) && time.Now().Before(deadline) {
			m, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil || m < 20 {
				continue
			}
			// A raw IPv4 socket returns the IP header.
			ihl := int(buf[0]&0x0f) * 4
			if m < ihl+8 {
				continue
			}
			icmp := buf[ihl:m]
			if r := binary.BigEndian.Uint16(icmp[6:]); icmp[0] == 0 && binary.BigEndian.Uint16(icmp[4:]) == id && r <= seq {
				replied[r] = true
			}
		}
	}
	return len(replied), nil
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
