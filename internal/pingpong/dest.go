package pingpong

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// RecordLen is the size of a side-channel record: sizeof
// "0000:000000:000000:00000000000000000000000000000000", the format with
// its NUL, as the stock tools write and read it.
const RecordLen = 52

// done is what the client sends after reading the server's record; the
// server waits for it before it starts, so that both QPs are connected.
var done = [5]byte{'d', 'o', 'n', 'e', 0}

// Dest is one end's record: how to reach its QP.
type Dest struct {
	LID uint16 // 0 on RoCE
	QPN uint32 // 24 bits
	PSN uint32 // 24 bits: the first PSN the QP sends
	GID [16]byte
}

// Addr is the GID as an IP address (IPv4-mapped GIDs as IPv4); invalid
// when the GID is zero, as the stock tools send it without -g.
func (d Dest) Addr() netip.Addr {
	if d.GID == ([16]byte{}) {
		return netip.Addr{}
	}
	return netip.AddrFrom16(d.GID).Unmap()
}

// GIDFromAddr is the GID of an IP address (IPv4 as ::ffff:a.b.c.d).
func GIDFromAddr(a netip.Addr) [16]byte {
	if !a.IsValid() {
		return [16]byte{}
	}
	return a.As16()
}

// GIDString is the GID as the tools print it (inet_ntop AF_INET6).
func (d Dest) GIDString() string { return netip.AddrFrom16(d.GID).String() }

// Marshal is the record as the stock tools send it: "%04x:%06x:%06x:" and
// the GID as 32 hex digits in wire order, NUL-terminated.
func (d Dest) Marshal() [RecordLen]byte {
	var b [RecordLen]byte
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN&0xffffff, d.PSN&0xffffff, hex.EncodeToString(d.GID[:]))
	copy(b[:], s) // exactly RecordLen-1 characters; the last byte stays NUL
	return b
}

// errRecord reports a record that is not the tools' format.
var errRecord = errors.New("pingpong: malformed side-channel record")

// ParseDest reads a record as the tools' sscanf("%x:%x:%x:%s") does, but
// strictly: three hex fields and 32 hex GID digits, up to the NUL. A
// record from a peer is hostile input: anything else is an error.
func ParseDest(b []byte) (Dest, error) {
	var d Dest
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	f := strings.Split(string(b), ":")
	if len(f) != 4 || len(f[3]) != 32 {
		return d, fmt.Errorf("%w: %q", errRecord, b)
	}
	var v [3]uint64
	for i, bits := range [3]int{16, 24, 24} {
		x, err := strconv.ParseUint(f[i], 16, bits)
		if err != nil || f[i] == "" {
			return d, fmt.Errorf("%w: field %d %q", errRecord, i+1, f[i])
		}
		v[i] = x
	}
	if _, err := hex.Decode(d.GID[:], []byte(f[3])); err != nil {
		return d, fmt.Errorf("%w: GID %q", errRecord, f[3])
	}
	d.LID, d.QPN, d.PSN = uint16(v[0]), uint32(v[1]), uint32(v[2])
	return d, nil
}
