package cm

import (
	"encoding/binary"
	"net/netip"
)

// rdma_cm (librdmacm and the kernel's cma.c) maps IP port spaces onto IB
// service IDs and prefixes the REQ's private data with the IP addresses and
// source port of the connection (struct cma_hdr).

// Port-space prefixes of rdma_cm service IDs: service ID = PS | port.
const (
	PortSpaceTCP   uint64 = 0x0000000001060000 // RDMA_PS_TCP (RC)
	PortSpaceUDP   uint64 = 0x0000000001110000 // RDMA_PS_UDP (UD, resolved with SIDR)
	PortSpaceIPoIB uint64 = 0x0000000001020000
	PortSpaceIB    uint64 = 0x00000000013F0000
	portSpaceMask  uint64 = 0xFFFFFFFFFFFF0000
)

// RDMAUDPQKey is the Q_Key rdma_cm gives UD QPs of the UDP port space.
const RDMAUDPQKey = 0x01234567

// ServiceIDTCP is the service ID rdma_cm listens on and connects to for an
// RC connection to TCP-space port port (e.g. rping's 7174).
func ServiceIDTCP(port uint16) uint64 { return PortSpaceTCP | uint64(port) }

// ServiceIDUDP is the service ID of UDP-space port port.
func ServiceIDUDP(port uint16) uint64 { return PortSpaceUDP | uint64(port) }

// ServicePort splits an rdma_cm service ID into its port space and port;
// ok is false when the ID is not in one of rdma_cm's IP port spaces.
func ServicePort(serviceID uint64) (ps uint64, port uint16, ok bool) {
	ps = serviceID & portSpaceMask
	switch ps {
	case PortSpaceTCP, PortSpaceUDP, PortSpaceIPoIB, PortSpaceIB:
		return ps, uint16(serviceID), true
	}
	return 0, 0, false
}

// CMAHeaderSize is the size of struct cma_hdr; CMAUserSize is what remains
// of a REQ's private data for the application.
const (
	CMAHeaderSize = 36
	CMAUserSize   = REQPrivateSize - CMAHeaderSize
	cmaVersion    = 0x00
)

// CMAHeader is the rdma_cm IP header at the start of a REQ's (or
// SIDR_REQ's) private data: cma_version, ip_version in the top nibble, the
// active side's port, then source and destination addresses. IPv4 addresses
// sit in the last 4 bytes of their 16-byte slots, the first 12 zero (not
// ::ffff:).
type CMAHeader struct {
	Version uint8
	SrcPort uint16
	Src     netip.Addr
	Dst     netip.Addr
}

// DecodeCMAHeader parses the header at the start of private data p. It
// fails on a short buffer, a version other than 0, an IP version other
// than 4 or 6.
func DecodeCMAHeader(p []byte) (CMAHeader, error) {
	if len(p) < CMAHeaderSize {
		return CMAHeader{}, ErrShortPrivate
	}
	h := CMAHeader{Version: p[0], SrcPort: binary.BigEndian.Uint16(p[2:])}
	if h.Version != cmaVersion {
		return CMAHeader{}, ErrBadCMAHeader
	}
	switch p[1] >> 4 {
	case 4:
		h.Src = netip.AddrFrom4([4]byte(p[16:20]))
		h.Dst = netip.AddrFrom4([4]byte(p[32:36]))
	case 6:
		h.Src = netip.AddrFrom16([16]byte(p[4:20]))
		h.Dst = netip.AddrFrom16([16]byte(p[20:36]))
	default:
		return CMAHeader{}, ErrBadCMAHeader
	}
	return h, nil
}

// EncodeCMAHeader writes h at the start of private data p (at least
// CMAHeaderSize bytes). Src and Dst must be of the same family; an IPv4
// mapped IPv6 address is written as IPv4, as rdma_cm does.
func EncodeCMAHeader(p []byte, h *CMAHeader) error {
	if len(p) < CMAHeaderSize {
		return ErrShortPrivate
	}
	src, dst := h.Src.Unmap(), h.Dst.Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return ErrBadCMAHeader
	}
	clear(p[:CMAHeaderSize])
	p[0] = h.Version
	binary.BigEndian.PutUint16(p[2:], h.SrcPort)
	if src.Is4() {
		p[1] = 4 << 4
		s, d := src.As4(), dst.As4()
		copy(p[16:20], s[:])
		copy(p[32:36], d[:])
	} else {
		p[1] = 6 << 4
		s, d := src.As16(), dst.As16()
		copy(p[4:20], s[:])
		copy(p[20:36], d[:])
	}
	return nil
}
