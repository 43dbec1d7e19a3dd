package perftest

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
)

// KeyRecordSize is the size of one key record on the wire when a GID is in
// use (always on RoCE): perftest's KEY_MSG_SIZE_GID, 107 characters and a NUL.
const KeyRecordSize = 108

// Dest is what perftest calls a pingpong_dest: everything the peer needs to
// reach one of our QPs and, for RDMA tests, our buffer.
type Dest struct {
	LID      uint16   // 0 on RoCE
	OutReads uint16   // how many RDMA READ/atomic requests our responder holds at once
	QPN      uint32   // 24 bits
	PSN      uint32   // 24 bits: the first PSN this QP sends
	RKey     uint32   // rkey of the buffer (0 when the MR has no remote access)
	VAddr    uint64   // start of the buffer
	GID      [16]byte // IPv4-mapped or IPv6 address of the QP's port
	SRQN     uint32   // XRC/DC only; 0 otherwise
}

// Addr returns the GID as an address (IPv4-mapped GIDs unmapped).
func (d Dest) Addr() netip.Addr { return netip.AddrFrom16(d.GID).Unmap() }

// GIDFromAddr turns an address into a RoCEv2 GID: IPv4 addresses become
// IPv4-mapped IPv6 (::ffff:a.b.c.d), as every RoCEv2 stack writes them.
func GIDFromAddr(a netip.Addr) [16]byte { return a.As16() }

// IsV4Mapped reports whether a GID is an IPv4-mapped one. perftest refuses
// to connect a v4-mapped GID to a non-mapped one (ctx_check_gid_compatibility).
func IsV4Mapped(gid [16]byte) bool { return netip.AddrFrom16(gid).Is4In6() }

var errRecord = errors.New("perftest: malformed key record")

// AppendRecord appends d as a 108-byte key record:
// "%04x:%04x:%06x:%06x:%08x:%016x:" then 16 "%02x:" then "%08x:" and a NUL.
// It fails if a field does not fit its width (QPN and PSN are 24-bit), since
// a longer record would desynchronise the peer's fixed-size reads.
func (d Dest) AppendRecord(b []byte) ([]byte, error) {
	if d.QPN > 0xffffff || d.PSN > 0xffffff {
		return b, fmt.Errorf("perftest: QPN %#x or PSN %#x wider than 24 bits", d.QPN, d.PSN)
	}
	b = appendHex(b, uint64(d.LID), 4)
	b = appendHex(b, uint64(d.OutReads), 4)
	b = appendHex(b, uint64(d.QPN), 6)
	b = appendHex(b, uint64(d.PSN), 6)
	b = appendHex(b, uint64(d.RKey), 8)
	b = appendHex(b, d.VAddr, 16)
	for _, g := range d.GID {
		b = appendHex(b, uint64(g), 2)
	}
	b = appendHex(b, uint64(d.SRQN), 8)
	return append(b, 0), nil // fixed widths: always KeyRecordSize bytes
}

// appendHex appends v as exactly width lower-case hex digits and a colon.
func appendHex(b []byte, v uint64, width int) []byte {
	const digits = "0123456789abcdef"
	for i := width - 1; i >= 0; i-- {
		b = append(b, digits[(v>>(4*uint(i)))&0xf])
	}
	return append(b, ':')
}

// ParseRecord parses a 108-byte key record. Like perftest it reads
// colon-separated hexadecimal fields up to the NUL; unlike perftest it
// rejects anything malformed instead of reading garbage.
func ParseRecord(rec []byte) (Dest, error) {
	var d Dest
	if len(rec) != KeyRecordSize {
		return d, fmt.Errorf("%w: %d bytes, want %d", errRecord, len(rec), KeyRecordSize)
	}
	// 6 fixed fields, 16 GID bytes, SRQN: 23 fields each ended by ':'.
	var fields [23]uint64
	bits := [23]int{16, 16, 24, 24, 32, 64}
	for i := 6; i < 22; i++ {
		bits[i] = 8
	}
	bits[22] = 32
	pos := 0
	for i := range fields {
		end := pos
		for end < len(rec) && rec[end] != ':' && rec[end] != 0 {
			end++
		}
		if end >= len(rec) || rec[end] != ':' || end == pos {
			return d, fmt.Errorf("%w: field %d", errRecord, i)
		}
		v, err := strconv.ParseUint(string(rec[pos:end]), 16, bits[i])
		if err != nil {
			return d, fmt.Errorf("%w: field %d: %w", errRecord, i, err)
		}
		fields[i] = v
		pos = end + 1
	}
	if pos >= len(rec) || rec[pos] != 0 {
		return d, fmt.Errorf("%w: no NUL after the SRQN", errRecord)
	}
	d.LID = uint16(fields[0])
	d.OutReads = uint16(fields[1])
	d.QPN = uint32(fields[2])
	d.PSN = uint32(fields[3])
	d.RKey = uint32(fields[4])
	d.VAddr = fields[5]
	for i := range d.GID {
		d.GID[i] = byte(fields[6+i])
	}
	d.SRQN = uint32(fields[22])
	return d, nil
}
