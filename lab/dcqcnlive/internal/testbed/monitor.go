package testbed

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
)

// Monitor is a passive AF_PACKET tap on sw's interface toward r. Frames sw
// sends there have left the tbf queue, so per-flow bytes in time bins are
// the rates each flow gets through the bottleneck, and their ECN field is
// what the marker did; frames arriving there come from r and carry its
// CNPs. It needs nothing from the endpoints, so a softrnic flow is measured
// exactly as the raw one is.
type Monitor struct {
	fd      int
	startNs uint64
	realOff int64 // CLOCK_REALTIME − CLOCK_MONOTONIC at the start, ns
	binNs   uint64
	maxBins int

	mu    sync.Mutex
	flows []*FlowTrace
	cnps  map[cnpKey]uint64
	other uint64 // frames that are not RoCEv2 (ARP, ICMP, ...)

	stop atomic.Bool
	done chan error
}

// FlowTrace is what the monitor saw of one flow: RoCEv2 frames from Src to
// the receiver QP DestQP.
type FlowTrace struct {
	Src    netip.Addr
	DestQP uint32
	Frames uint64
	Bytes  uint64 // Ethernet frame bytes, as tbf counts them
	CE     uint64 // frames that left the bottleneck CE-marked
	NotECT uint64 // frames that were not ECN-capable
	Bins   []uint64
}

type cnpKey struct {
	dst netip.Addr // the reaction point's address
	qp  uint32     // the reaction point's QP (BTH DestQP of the CNP)
}

// monoNow is CLOCK_MONOTONIC in ns: the clock bpf_ktime_get_ns reads, so
// monitor, marker samples and qdisc polls share one time axis.
func monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // fails only for a bad pointer
	return uint64(ts.Nano())
}

// StartMonitor opens the tap on sw→r and starts reading. Bins of binNs
// nanoseconds start now; at most maxBins are kept (later frames are counted
// in the totals only).
func (t *Topology) StartMonitor(binNs uint64, maxBins int) (*Monitor, error) {
	if binNs == 0 || maxBins <= 0 {
		return nil, errors.New("testbed: monitor needs a bin width and a bin count")
	}
	m := &Monitor{fd: -1, binNs: binNs, maxBins: maxBins, cnps: map[cnpKey]uint64{}, done: make(chan error, 1)}
	err := t.SW.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return fmt.Errorf("testbed: monitor socket: %w", err)
		}
		m.fd = fd
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) != nil {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
		}
		// Kernel receive timestamps (CLOCK_REALTIME, taken when the
		// frame is handed to the tap), so a descheduled reader does not
		// move frames into later bins.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
			return fmt.Errorf("testbed: monitor SO_TIMESTAMPNS: %w", err)
		}
		// A bounded wait, so that Stop is seen within 50 ms.
		tv := unix.Timeval{Usec: 50_000}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return fmt.Errorf("testbed: monitor SO_RCVTIMEO: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: t.R.Peer.Index}); err != nil {
			return fmt.Errorf("testbed: monitor bind: %w", err)
		}
		return nil
	})
	if err != nil {
		if m.fd >= 0 {
			unix.Close(m.fd)
		}
		return nil, err
	}
	m.startNs = monoNow()
	var rt unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_REALTIME, &rt) // fails only for a bad pointer
	m.realOff = rt.Nano() - int64(monoNow())
	go m.loop()
	return m, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// StartNs is the monitor's time origin (CLOCK_MONOTONIC ns), bin 0's start.
func (m *Monitor) StartNs() uint64 { return m.startNs }

// BinNs is the bin width.
func (m *Monitor) BinNs() uint64 { return m.binNs }

func (m *Monitor) loop() {
	var r receiver
	r.init(1 << 16)
	var f frame.Frame
	var err error
	for !m.stop.Load() {
		n, pkttype, realNs, rerr := r.recv(m.fd)
		if rerr != nil {
			if errors.Is(rerr, unix.EAGAIN) || errors.Is(rerr, unix.EINTR) {
				continue
			}
			err = fmt.Errorf("testbed: monitor: %w", rerr)
			break
		}
		now := monoNow()
		if realNs != 0 {
			now = uint64(realNs - m.realOff)
		}
		m.account(r.buf[:n], pkttype, now, &f)
	}
	m.done <- err
}

// receiver is recvmsg(2) on a packet socket with preallocated buffers, so
// reading a frame allocates nothing (unix.Recvmsg allocates a Sockaddr per
// call).
type receiver struct {
	buf  []byte
	oob  [16]uint64 // control messages; uint64 keeps the cmsg headers aligned
	name unix.RawSockaddrLinklayer
	iov  unix.Iovec
	hdr  unix.Msghdr
}

func (r *receiver) init(size int) {
	r.buf = make([]byte, size)
	r.iov.Base = &r.buf[0]
	r.iov.SetLen(size)
	r.hdr.Iov = &r.iov
	r.hdr.Iovlen = 1
}

// account adds one frame seen at now (CLOCK_MONOTONIC ns).
func (m *Monitor) account(b []byte, pkttype uint8, now uint64, f *frame.Frame) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if frame.Parse(b, f) != nil {
		m.other++
		return
	}
	op := f.Opcode()
	if pkttype != unix.PACKET_OUTGOING {
		// From r: CNPs (and ACKs, not counted here).
		if op == bth.CNP {
			m.cnps[cnpKey{f.Dst(), f.BTH().DestQP()}]++
		}
		return
	}
	src, qp := f.Src(), f.BTH().DestQP()
	var ft *FlowTrace
	for _, x := range m.flows {
		if x.Src == src && x.DestQP == qp {
			ft = x
			break
		}
	}
	if ft == nil {
		ft = &FlowTrace{Src: src, DestQP: qp}
		m.flows = append(m.flows, ft)
	}
	ft.Frames++
	ft.Bytes += uint64(len(b))
	switch f.ECN() {
	case 3:
		ft.CE++
	case 0:
		ft.NotECT++
	}
	if now >= m.startNs {
		if i := (now - m.startNs) / m.binNs; i < uint64(m.maxBins) {
			if int(i) >= len(ft.Bins) {
				ft.Bins = append(ft.Bins, make([]uint64, int(i)+1-len(ft.Bins))...)
			}
			ft.Bins[i] += uint64(len(b))
		}
	}
}

// Snapshot returns copies of the flow traces seen so far, in order of first
// appearance, and the CNPs counted per reaction-point address.
func (m *Monitor) Snapshot() (flows []FlowTrace, cnpsTo map[netip.Addr]uint64, other uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, x := range m.flows {
		c := *x
		c.Bins = slices.Clone(x.Bins)
		flows = append(flows, c)
	}
	cnpsTo = map[netip.Addr]uint64{}
	for k, v := range m.cnps {
		cnpsTo[k.dst] += v
	}
	return flows, cnpsTo, m.other
}

// Stop ends the tap and closes its socket.
func (m *Monitor) Stop() error {
	if m.stop.Swap(true) {
		return nil
	}
	err := <-m.done
	unix.Close(m.fd)
	return err
}
