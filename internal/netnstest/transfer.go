package netnstest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/port"
)

// RoCEFrame writes into b (which must be size bytes, at least 46) an
// Ethernet + IPv4 + UDP/4791 frame from src to dst whose payload starts with
// seq and continues with bytes derived from seq, so that a receiver can check
// every byte. It returns b.
func RoCEFrame(b []byte, src, dst *Link, seq uint32) []byte {
	size := len(b)
	copy(b[0:6], dst.MAC)
	copy(b[6:12], src.MAC)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:34]
	ip[0], ip[1] = 0x45, 0
	binary.BigEndian.PutUint16(ip[2:], uint16(size-14))
	binary.BigEndian.PutUint16(ip[4:], uint16(seq))
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF, as RoCEv2 sends
	ip[8], ip[9] = 64, 17
	ip[10], ip[11] = 0, 0
	s4, d4 := src.Addr.As4(), dst.Addr.As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	udp := b[34:42]
	binary.BigEndian.PutUint16(udp[0:], 49152+uint16(seq%1024))
	binary.BigEndian.PutUint16(udp[2:], 4791)
	binary.BigEndian.PutUint16(udp[4:], uint16(size-34))
	udp[6], udp[7] = 0, 0
	binary.BigEndian.PutUint32(b[42:], seq)
	x := seq*2654435761 + 1
	for i := 46; i < size; i++ {
		b[i] = byte(x >> 24)
		x = x*1664525 + 1013904223
	}
	return b
}

// TransferResult is what Transfer measured.
type TransferResult struct {
	Sent, Received int
	Elapsed        time.Duration
}

// Transfer sends n RoCEv2 frames from tx (on link src) to rx (on link dst),
// frame i being size(i) bytes, and checks on the receiving side that every
// frame arrives, in order, byte for byte. It keeps at most window frames in
// flight so that a slow receiver does not make the link drop (which would be
// a property of the link, not a fault of the ports). Everything is bounded by
// limit. tx and rx are each used only by the goroutine Transfer gives them.
func Transfer(tx, rx port.Port, src, dst *Link, n int, size func(i int) int, window int, limit time.Duration) (TransferResult, error) {
	deadline := time.Now().Add(limit)
	var received atomic.Int64
	rerr := make(chan error, 1)
	start := time.Now()
	go func() {
		frames := make([][]byte, port.BatchSize)
		want := make([]byte, rx.MaxFrame())
		got := 0
		for got < n {
			if time.Now().After(deadline) {
				rerr <- fmt.Errorf("receiver: %d of %d frames before the time limit", got, n)
				return
			}
			k, err := rx.Recv(frames, 20*time.Millisecond)
			if err != nil {
				rerr <- fmt.Errorf("receiver: Recv: %w", err)
				return
			}
			for _, f := range frames[:k] {
				if len(f) < 46 {
					rerr <- fmt.Errorf("receiver: frame %d: %d bytes", got, len(f))
					return
				}
				seq := int(binary.BigEndian.Uint32(f[42:]))
				if seq != got {
					rerr <- fmt.Errorf("receiver: frame %d carries sequence %d (lost or reordered)", got, seq)
					return
				}
				exp := RoCEFrame(want[:size(got)], src, dst, uint32(got))
				if !bytes.Equal(f, exp) {
					rerr <- fmt.Errorf("receiver: frame %d (%d bytes, want %d) differs", got, len(f), len(exp))
					return
				}
				got++
			}
			received.Store(int64(got))
		}
		rerr <- nil
	}()

	bufs := make([][]byte, port.BatchSize)
	for i := range bufs {
		bufs[i] = make([]byte, tx.MaxFrame())
	}
	batch := make([][]byte, 0, port.BatchSize)
	sent := 0
	var serr error
	for sent < n && serr == nil {
		if time.Now().After(deadline) {
			serr = fmt.Errorf("sender: %d of %d frames sent before the time limit", sent, n)
			break
		}
		select {
		case err := <-rerr:
			rerr <- err // keep it for below
			serr = fmt.Errorf("sender stopped at %d: receiver ended", sent)
			continue
		default:
		}
		room := window - (sent - int(received.Load()))
		if room <= 0 {
			time.Sleep(20 * time.Microsecond)
			continue
		}
		batch = batch[:0]
		for i := 0; i < min(room, port.BatchSize, n-sent); i++ {
			batch = append(batch, RoCEFrame(bufs[i][:size(sent+i)], src, dst, uint32(sent+i)))
		}
		k, err := port.Send(tx, batch)
		sent += k
		if err != nil {
			serr = fmt.Errorf("sender: Send: %w", err)
		} else if k < len(batch) {
			time.Sleep(20 * time.Microsecond) // back-pressure: let completions come
		}
	}
	var err error
	select {
	case err = <-rerr:
	case <-time.After(time.Until(deadline) + time.Second):
		err = fmt.Errorf("receiver did not finish")
	}
	res := TransferResult{Sent: sent, Received: int(received.Load()), Elapsed: time.Since(start)}
	if serr != nil {
		return res, fmt.Errorf("%w; %w", serr, err)
	}
	return res, err
}
