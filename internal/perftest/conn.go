package perftest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"syscall"
)

// Version is the perftest version we announce. perftest from 6.28 on sends
// a raw, build-dependent binary struct (perftest_parameters_negotiate, with
// a host-order ibv_device_attr inside) when the peer's version is ≥ 6.28;
// announcing a version in [5.70, 6.28) makes it skip that exchange, and
// 6.06 is exactly what Debian's perftest (and the reference captures)
// announce. Everything else in the channel is the same across these versions.
const Version = "6.06"

// MinPeerVersion is the oldest peer perftest accepts since 5.70
// (check_version_compatibility); older peers also use 4-byte iteration
// counts and MTU fields we do not speak.
const MinPeerVersion = 5.70

// VersionSize is the version field on the wire: char version[16], NUL-padded.
const VersionSize = 16

// DefaultPort is perftest's TCP port (DEF_PORT).
const DefaultPort = 18515

// reportValues is how many 8-byte values xchg_bw_reports exchanges without
// --report_per_port: size, iterations, peak BW, average BW, message rate.
const reportValues = 5

// BWReport is what a bandwidth test reports and exchanges in
// xchg_bw_reports. Bandwidths are in the sender's own units (MiB/s, or
// Gb/s with --report_gbits): perftest does not convert what it receives.
type BWReport struct {
	Size    uint64  // message size in bytes
	Iters   uint64  // messages completed (all QPs)
	PeakBW  float64 // best bandwidth over any window of CQ-moderation batches
	AvgBW   float64 // bytes moved over the whole run
	MsgRate float64 // millions of messages per second
}

// Conn is one end of perftest's TCP side channel. Every exchange is
// symmetric and fixed-size: the client writes then reads, the server reads
// then writes, which is what keeps two perftests in lock step.
type Conn struct {
	rw     io.ReadWriter
	client bool

	// PeerVersion is the version string the peer announced, once known.
	PeerVersion string
}

// NewConn wraps an established TCP connection (or any stream) as the client
// or server end of the side channel.
func NewConn(rw io.ReadWriter, client bool) *Conn { return &Conn{rw: rw, client: client} }

// Exchange sends mine and reads exactly len(theirs) bytes, in the order
// perftest's ctx_xchg_data_ethernet does for this end.
func (c *Conn) Exchange(mine, theirs []byte) error {
	if c.client {
		if _, err := c.rw.Write(mine); err != nil {
			return err
		}
		_, err := io.ReadFull(c.rw, theirs)
		return err
	}
	if _, err := io.ReadFull(c.rw, theirs); err != nil {
		return err
	}
	_, err := c.rw.Write(mine)
	return err
}

// ExchangeVersion swaps version strings (exchange_versions) and checks the
// peer is one we speak to (check_version_compatibility).
func (c *Conn) ExchangeVersion() (string, error) {
	var mine, theirs [VersionSize]byte
	copy(mine[:], Version)
	if err := c.Exchange(mine[:], theirs[:]); err != nil {
		return "", fmt.Errorf("perftest: version exchange: %w", err)
	}
	n := 0
	for n < len(theirs) && theirs[n] != 0 {
		n++
	}
	c.PeerVersion = string(theirs[:n])
	if v := VersionNumber(c.PeerVersion); v < MinPeerVersion {
		return c.PeerVersion, fmt.Errorf("perftest: peer version %q is older than %.2f", c.PeerVersion, MinPeerVersion)
	}
	return c.PeerVersion, nil
}

// VersionNumber reads a version string as perftest does, with atof: the
// longest leading decimal number, 0 if there is none.
func VersionNumber(s string) float64 {
	end, dot := 0, false
	for end < len(s) {
		ch := s[end]
		if ch == '.' && !dot {
			dot = true
		} else if ch < '0' || ch > '9' {
			break
		}
		end++
	}
	v, err := strconv.ParseFloat(s[:end], 64)
	if err != nil {
		return 0
	}
	return v
}

// ExchangeSysData swaps page size and cache-line size as 4-byte big-endian
// ints (check_sys_data) and returns the larger of each, as both sides then
// use: the page size sets the cycle buffer the remote address wraps in.
func (c *Conn) ExchangeSysData(pageSize, cacheLine int) (int, int, error) {
	var mine, theirs [4]byte
	binary.BigEndian.PutUint32(mine[:], uint32(pageSize))
	if err := c.Exchange(mine[:], theirs[:]); err != nil {
		return 0, 0, fmt.Errorf("perftest: page size exchange: %w", err)
	}
	peerPage := int(int32(binary.BigEndian.Uint32(theirs[:])))
	binary.BigEndian.PutUint32(mine[:], uint32(cacheLine))
	if err := c.Exchange(mine[:], theirs[:]); err != nil {
		return 0, 0, fmt.Errorf("perftest: cache line exchange: %w", err)
	}
	peerLine := int(int32(binary.BigEndian.Uint32(theirs[:])))
	return max(pageSize, peerPage), max(cacheLine, peerLine), nil
}

// MTU is an IB path MTU code as in enum ibv_mtu: 1=256 … 5=4096 bytes.
type MTU uint8

// Bytes returns the MTU in bytes, 0 for an invalid code.
func (m MTU) Bytes() int {
	if !m.Valid() {
		return 0
	}
	return 128 << m
}

// Valid reports whether m is one of the five IB MTUs.
func (m MTU) Valid() bool { return m >= 1 && m <= 5 }

// MTUFromBytes returns the largest IB MTU not above n bytes (0 below 256).
func MTUFromBytes(n int) MTU {
	for m := MTU(5); m >= 1; m-- {
		if m.Bytes() <= n {
			return m
		}
	}
	return 0
}

// ExchangeMTU swaps MTU codes as 2 bytes of "%d" text (check_mtu, peers ≥
// 5.31) and returns the smaller of ours and a valid peer's.
func (c *Conn) ExchangeMTU(ours MTU) (MTU, error) {
	if !ours.Valid() {
		return 0, fmt.Errorf("perftest: invalid MTU code %d", ours)
	}
	mine := [2]byte{'0' + byte(ours), 0}
	var theirs [2]byte
	if err := c.Exchange(mine[:], theirs[:]); err != nil {
		return 0, fmt.Errorf("perftest: MTU exchange: %w", err)
	}
	peer := MTU(0)
	if theirs[0] >= '0' && theirs[0] <= '9' && (theirs[1] == 0 || (theirs[1] >= '0' && theirs[1] <= '9')) {
		n, _ := strconv.Atoi(string(theirs[:1+boolInt(theirs[1] != 0)]))
		peer = MTU(min(n, 255))
	}
	if peer.Valid() && peer < ours {
		return peer, nil
	}
	return ours, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// HandShake swaps one key record (ctx_hand_shake). perftest uses the same
// call both to exchange QP parameters and, with the same record, as a
// barrier between the phases of a test.
func (c *Conn) HandShake(my Dest) (Dest, error) {
	var mine [KeyRecordSize]byte
	b, err := my.AppendRecord(mine[:0])
	if err != nil {
		return Dest{}, err
	}
	var theirs [KeyRecordSize]byte
	if err := c.Exchange(b, theirs[:]); err != nil {
		return Dest{}, fmt.Errorf("perftest: key exchange: %w", err)
	}
	return ParseRecord(theirs[:])
}

// ExchangeReports swaps bandwidth reports as five 8-byte big-endian values
// (xchg_bw_reports): size and iterations as integers, the rest as IEEE-754
// doubles.
func (c *Conn) ExchangeReports(my BWReport) (BWReport, error) {
	mine := [reportValues]uint64{my.Size, my.Iters, math.Float64bits(my.PeakBW), math.Float64bits(my.AvgBW), math.Float64bits(my.MsgRate)}
	var got [reportValues]uint64
	var out, in [8]byte
	for i := range mine {
		binary.BigEndian.PutUint64(out[:], mine[i])
		if err := c.Exchange(out[:], in[:]); err != nil {
			return BWReport{}, fmt.Errorf("perftest: report exchange: %w", err)
		}
		got[i] = binary.BigEndian.Uint64(in[:])
	}
	return BWReport{
		Size: got[0], Iters: got[1],
		PeakBW: math.Float64frombits(got[2]), AvgBW: math.Float64frombits(got[3]), MsgRate: math.Float64frombits(got[4]),
	}, nil
}

// doneMsg ends the channel: perftest up to 2023 writes "done" with its NUL
// after the closing handshake; later versions just close the socket.
var doneMsg = []byte("done\x00")

// Finish writes "done" and waits for the peer's "done" or end of stream.
// Both perftest generations are accepted: one writes "done", one closes;
// neither reads what we write, so a failed write after their close is not
// an error.
func (c *Conn) Finish() error {
	_, _ = c.rw.Write(doneMsg)
	var got [len("done\x00")]byte
	n, err := io.ReadFull(c.rw, got[:])
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		if n > 0 && string(got[:n]) != string(doneMsg[:n]) {
			return fmt.Errorf("perftest: expected \"done\", got %q", got[:n])
		}
		return nil
	}
	return err
}
