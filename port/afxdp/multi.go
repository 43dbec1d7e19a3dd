package afxdp

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/xsk"
)

// MultiConfig describes a port that serves several receive queues of one
// interface, one AF_XDP socket (and UMEM) per queue, all registered in the
// XSKMAP of one steering program.
type MultiConfig struct {
	// Config is used for every queue's socket; its Queue is ignored. With a
	// nil Program the multi-queue port loads, attaches and detaches one.
	Config
	// Queues is how many receive queues to serve, 0..Queues-1; 0 serves all
	// of the interface's (RxQueues).
	Queues int
	// TxQueue is the queue whose socket transmits every frame (default 0),
	// unless SpreadTx.
	TxQueue int
	// SpreadTx transmits each frame on a queue chosen by a hash of its UDP
	// source port.
	// A QP's frames all carry one source port (rdma_get_udp_sport of its
	// flow), so each QP keeps one queue and its frames their order, which
	// RC and UC need, while different QPs use different queues, as a
	// kernel peer's flows do through XPS and the flow hash. Frames that are
	// not IPv4/IPv6 UDP go out on TxQueue.
	SpreadTx bool
}

// Multi is a port.Port over several receive queues of one interface, for
// NICs whose RSS spreads RoCEv2 over several queues (the UDP source port
// varies per QP): a queue without a socket would leave its RoCEv2 to the
// kernel, which drops it.
//
// Like every port.Port it belongs to one goroutine: the device's engine
// loop. The device stays one engine goroutine fed by N sockets (see Recv
// for how the queues share it), because rnic.Device's step functions must
// never run concurrently: "one engine goroutine per queue" is in
// fact one per device. N queues therefore buy completeness (no queue's
// RoCEv2 is left to the kernel) and deeper rings, not more CPU; sharding
// QPs over several engine goroutines would be the next step.
type Multi struct {
	ports     []*Port
	queues    []int
	prog      *bpf.Program
	ownsProg  bool
	tx        *Port
	spread    bool
	txDefault int

	// subs are the per-queue ports as Recv sees them (ports, or fakes in
	// tests); wait blocks until one of them may have frames. txq are the
	// same queues as SpreadTx sends on them, kick marks those to wake at
	// the end of a Send.
	subs []port.Port
	wait func(time.Duration) error
	txq  []txQueue
	kick []bool

	next     int           // the queue Recv visits first
	received []uint64      // frames received, per queue (loop-owned)
	scratch  [][]byte      // Submit's slots of other queues' sockets
	back     [][]byte      // Submit's lent slots going back unsent
	pfds     []unix.PollFd // the queues' sockets, then wake's eventfd
	wake     *port.Wakeup
	ts       unix.Timespec
	closed   bool
}

var (
	_ port.Port    = (*Multi)(nil)
	_ port.Waker   = (*Multi)(nil)
	_ port.RxGauge = (*Multi)(nil)
)

// OpenMulti opens one AF_XDP socket per receive queue and registers all of
// them with one steering program.
func OpenMulti(cfg MultiConfig) (m *Multi, err error) {
	n := cfg.Queues
	if n <= 0 {
		if n, err = RxQueues(cfg.IfIndex); err != nil {
			return nil, err
		}
	} else if ifc, err := net.InterfaceByIndex(cfg.IfIndex); err == nil {
		// Refuse clearly rather than with bind's EINVAL; only when the
		// driver reports its channels (without them, trust the caller).
		if have, err := ethtoolRxQueues(ifc.Name); err == nil && have > 0 && n > have {
			return nil, fmt.Errorf("afxdp: %s has %d receive queues; cannot serve %d", ifc.Name, have, n)
		}
	}
	if cfg.TxQueue < 0 || cfg.TxQueue >= n {
		return nil, fmt.Errorf("afxdp: transmit queue %d is not one of the %d queues served", cfg.TxQueue, n)
	}
	m = &Multi{prog: cfg.Program, next: 0}
	defer func() {
		if err != nil {
			err = errors.Join(err, m.Close())
			m = nil
		}
	}()
	if m.prog == nil {
		if m.prog, err = bpf.Load(bpf.Options{Queues: n, FilterLocal: len(cfg.LocalAddrs) > 0}); err != nil {
			return m, fmt.Errorf("afxdp: %w", err)
		}
		m.ownsProg = true
		for _, a := range cfg.LocalAddrs {
			if err = m.prog.AddLocal(a); err != nil {
				return m, fmt.Errorf("afxdp: local address %v: %w", a, err)
			}
		}
		// Attaching before the sockets exist loses nothing: until a
		// queue's socket is registered its RoCEv2 stays with the kernel.
		if _, err = m.prog.AttachWith(cfg.IfIndex, cfg.XDPMode); err != nil {
			return m, fmt.Errorf("afxdp: %w", err)
		}
	}
	for q := 0; q < n; q++ {
		c := cfg.Config
		c.Queue, c.Program = q, m.prog
		p, err := Open(c)
		if err != nil {
			return m, fmt.Errorf("afxdp: queue %d of %d: %w", q, n, err)
		}
		m.ports = append(m.ports, p)
		m.queues = append(m.queues, q)
		m.subs = append(m.subs, p)
		m.txq = append(m.txq, p)
		m.pfds = append(m.pfds, unix.PollFd{Fd: int32(p.sock.FD()), Events: unix.POLLIN})
	}
	if m.wake, err = port.NewWakeup(); err != nil {
		return m, fmt.Errorf("afxdp: %w", err)
	}
	m.pfds = append(m.pfds, unix.PollFd{Fd: int32(m.wake.FD()), Events: unix.POLLIN})
	m.tx = m.ports[cfg.TxQueue]
	m.spread, m.txDefault = cfg.SpreadTx && n > 1, cfg.TxQueue
	m.received = make([]uint64, n)
	m.kick = make([]bool, n)
	m.scratch = make([][]byte, port.BatchSize)
	m.back = make([][]byte, port.BatchSize)
	m.wait = m.poll
	return m, nil
}

// Recv implements port.Port. Each queue's port is asked once per call, in
// turn, starting one queue further on every call, and the first one asked
// may fill the whole batch: over any len(Queues) consecutive calls every
// queue is asked first once, so none starves however busy the others are,
// and a busy queue still gets whole batches. Views stay valid until the
// next Recv: a queue's frames go back to its FILL ring when its port is
// asked again, which every call does for every queue.
func (m *Multi) Recv(frames [][]byte, timeout time.Duration) (int, error) {
	if m.closed {
		return 0, port.ErrClosed
	}
	n, err := m.pass(frames)
	if n > 0 || err != nil || timeout <= 0 {
		return n, err
	}
	if err := m.wait(timeout); err != nil {
		return 0, err
	}
	return m.pass(frames)
}

// pass asks every queue once, without waiting.
func (m *Multi) pass(frames [][]byte) (int, error) {
	k := len(m.subs)
	start := m.next
	m.next++
	if m.next == k {
		m.next = 0
	}
	n := 0
	var errs error
	for i := 0; i < k; i++ {
		q := start + i
		if q >= k {
			q -= k
		}
		// An empty slice still returns the queue's previous frames to
		// its FILL ring.
		got, err := m.subs[q].Recv(frames[n:], 0)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		m.received[q] += uint64(got)
		n += got
	}
	return n, errs
}

// poll sleeps until a socket has frames, Wake is called or timeout passes.
func (m *Multi) poll(timeout time.Duration) error {
	for i := range m.pfds {
		m.pfds[i].Revents = 0
	}
	m.ts = unix.NsecToTimespec(int64(timeout))
	if _, err := unix.Ppoll(m.pfds, &m.ts, nil); err != nil && err != unix.EINTR {
		return fmt.Errorf("afxdp: poll: %w", err)
	}
	if m.pfds[len(m.pfds)-1].Revents != 0 {
		m.wake.Drain()
	}
	return nil
}

// Wake implements port.Waker.
func (m *Multi) Wake() error { return m.wake.Wake() }

// Lend implements port.Port: the buffers are transmit slots of
// MultiConfig.TxQueue's socket.
func (m *Multi) Lend(bufs [][]byte) int {
	if m.closed {
		return 0
	}
	return m.tx.Lend(bufs)
}

// Submit implements port.Port: every frame leaves through
// MultiConfig.TxQueue, or with SpreadTx through its flow's queue. Frames
// are built in TxQueue's slots; one for another queue is copied into a
// slot of that queue's socket (each socket has a UMEM of its own), and its
// slot given back. A run of frames for one queue is posted in one go and
// each queue is woken once per call, however the runs interleave (copy
// mode pays a sendto per wakeup); the first short post ends the call, so
// that no frame overtakes one that must be retried.
func (m *Multi) Submit(frames [][]byte) (int, error) {
	if m.closed {
		return 0, port.ErrClosed
	}
	if !m.spread {
		return m.tx.Submit(frames)
	}
	sent := 0
	var err error
	for sent < len(frames) {
		q := m.txQueue(frames[sent])
		end := sent + 1
		for end < len(frames) && m.txQueue(frames[end]) == q {
			end++
		}
		var k int
		var perr error
		if q == m.txDefault {
			k, perr = m.txq[q].post(frames[sent:end])
		} else {
			k, perr = m.txq[q].postCopy(frames[sent:end], m.scratch)
			if k > 0 {
				// The copies went; their lent slots go back unsent.
				for i, f := range frames[sent : sent+k] {
					m.back[i] = f[:0]
				}
				_, _ = m.txq[m.txDefault].post(m.back[:k]) // empty lent slots: taken back
				clear(m.back[:k])
			}
		}
		if k > 0 {
			m.kick[q] = true
		}
		sent += k
		if perr != nil || sent < end {
			err = perr
			break
		}
	}
	for q, k := range m.kick {
		if k {
			m.kick[q] = false
			if kerr := m.txq[q].kickTx(); kerr != nil && err == nil {
				err = kerr
			}
		}
	}
	return sent, err
}

// txQueue is a queue as SpreadTx sends on it: Port, or a fake in tests.
type txQueue interface {
	post(frames [][]byte) (int, error) // Submit without the wakeup
	// postCopy posts copies of frames (another socket's memory) in slots
	// of its own, scratch holding the slots; it returns how many went.
	postCopy(frames, scratch [][]byte) (int, error)
	kickTx() error // the wakeup
}

// post is Submit without waking the kernel: Multi wakes each queue once
// per batch.
func (p *Port) post(frames [][]byte) (int, error) {
	if p.closed {
		return 0, port.ErrClosed
	}
	n, err := p.sock.Submit(frames)
	switch {
	case errors.Is(err, xsk.ErrFrameTooLarge):
		return n, fmt.Errorf("afxdp: frame %d is %d bytes, larger than %d: %w", n, len(frames[n]), p.MaxFrame(), err)
	case errors.Is(err, xsk.ErrNotLent):
		return n, fmt.Errorf("afxdp: frame %d: %w", n, port.ErrNotLent)
	}
	return n, err
}

// postCopy implements txQueue.
func (p *Port) postCopy(frames, scratch [][]byte) (int, error) {
	if p.closed {
		return 0, port.ErrClosed
	}
	n := p.sock.Lend(scratch[:min(len(frames), len(scratch))])
	for i := range scratch[:n] {
		scratch[i] = scratch[i][:copy(scratch[i], frames[i])]
	}
	k, err := p.post(scratch[:n])
	for i := k; i < n; i++ {
		scratch[i] = scratch[i][:0]
	}
	_, _ = p.sock.Submit(scratch[k:n]) // slots of its own, empty: taken back whatever else fails
	clear(scratch[:n])
	return k, err
}

func (p *Port) kickTx() error {
	if p.closed {
		return port.ErrClosed
	}
	return p.sock.Kick()
}

// txQueue is the queue a frame leaves on with SpreadTx.
func (m *Multi) txQueue(f []byte) int {
	sport, ok := udpSourcePort(f)
	if !ok {
		return m.txDefault
	}
	return flowQueue(sport, len(m.subs))
}

// flowQueue maps a UDP source port to one of n queues through a
// multiplicative hash: the ports of neighbouring QPs differ in a few bits
// only (rdma_get_udp_sport of consecutive QPNs), and a plain modulo sent
// them all to the same two of four queues.
func flowQueue(sport uint16, n int) int {
	h := uint32(sport) * 0x9E3779B1
	return int(uint64(h) * uint64(n) >> 32)
}

// udpSourcePort reads the UDP source port of an Ethernet (optionally
// 802.1Q-tagged) IPv4 or IPv6 frame.
func udpSourcePort(f []byte) (uint16, bool) {
	off := 14
	if len(f) < off {
		return 0, false
	}
	et := uint16(f[12])<<8 | uint16(f[13])
	if et == 0x8100 {
		if len(f) < 18 {
			return 0, false
		}
		et, off = uint16(f[16])<<8|uint16(f[17]), 18
	}
	switch et {
	case 0x0800:
		if len(f) < off+20 || f[off+9] != 17 {
			return 0, false
		}
		off += int(f[off]&0x0f) * 4
	case 0x86dd:
		if len(f) < off+40 || f[off+6] != 17 {
			return 0, false
		}
		off += 40
	default:
		return 0, false
	}
	if len(f) < off+2 {
		return 0, false
	}
	return uint16(f[off])<<8 | uint16(f[off+1]), true
}

// MaxFrame implements port.Port.
func (m *Multi) MaxFrame() int { return m.tx.MaxFrame() }

// RxFrames is how many frames the port holds for its reader, over every
// queue (Port.RxFrames).
func (m *Multi) RxFrames() int {
	n := 0
	for _, p := range m.ports {
		n += p.RxFrames()
	}
	return n
}

// RxLevel implements port.RxGauge: the level of the queue whose FILL ring
// holds the smallest share of its buffers, the first to drop.
func (m *Multi) RxLevel() (fill, queued, buffers int) {
	for i, p := range m.ports {
		f, q, b := p.RxLevel()
		if i == 0 || f*buffers < fill*b {
			fill, queued, buffers = f, q, b
		}
	}
	return fill, queued, buffers
}

// NumQueues is how many receive queues the port serves.
func (m *Multi) NumQueues() int { return len(m.subs) }

// Queue returns the port of the i-th queue served (for tests and tools
// that must transmit on a given queue). Using it while the Multi is in use
// breaks the one-goroutine rule.
func (m *Multi) Queue(i int) *Port { return m.ports[i] }

// Program is the steering program in use.
func (m *Multi) Program() *bpf.Program { return m.prog }

// QueueStats is one queue's share of a Multi's traffic.
type QueueStats struct {
	Queue    int
	Received uint64 // frames Recv returned from this queue
	Stats
}

// QueueStats reads each queue's statistics (slow path, the owning
// goroutine only).
func (m *Multi) QueueStats() ([]QueueStats, error) {
	if m.closed {
		return nil, port.ErrClosed
	}
	out := make([]QueueStats, len(m.ports))
	var errs error
	for i, p := range m.ports {
		st, err := p.Stats()
		errs = errors.Join(errs, err)
		out[i] = QueueStats{Queue: m.queues[i], Received: m.received[i], Stats: st}
	}
	return out, errs
}

// Stats sums the sockets' statistics; the program's counters are the
// interface's, counted once (slow path, the owning goroutine only).
func (m *Multi) Stats() (Stats, error) {
	qs, err := m.QueueStats()
	if len(qs) == 0 {
		return Stats{}, err
	}
	st := qs[0].Stats
	for _, q := range qs[1:] {
		s, t := &st.Socket, &q.Socket
		s.RxDropped += t.RxDropped
		s.RxInvalidDescs += t.RxInvalidDescs
		s.TxInvalidDescs += t.TxInvalidDescs
		s.RxRingFull += t.RxRingFull
		s.RxFillRingEmpty += t.RxFillRingEmpty
		s.TxRingEmptyDescs += t.TxRingEmptyDescs
		s.RxDescs += t.RxDescs
		s.TxDescs += t.TxDescs
		s.TxCompleted += t.TxCompleted
		s.Kicks += t.Kicks
		s.KicksSuppressed += t.KicksSuppressed
		s.Polls += t.Polls
		s.TxNoFrame += t.TxNoFrame
		st.Oversize += q.Oversize
		st.Copied += q.Copied
		st.ZeroCopy = st.ZeroCopy && q.ZeroCopy
		st.Multi = st.Multi || q.Multi
	}
	return st, err
}

// Close closes every queue's socket, then detaches the program if the
// port attached it.
func (m *Multi) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	var errs []error
	for _, p := range m.ports {
		errs = append(errs, p.Close())
	}
	if m.ownsProg && m.prog != nil {
		errs = append(errs, m.prog.Close())
	}
	errs = append(errs, m.wake.Close())
	return errors.Join(errs...)
}

// RxQueues returns how many receive queues the interface uses: the
// ethtool channel counts (rx plus combined channels, as ethtool -l shows
// them), read in the calling thread's network namespace. Interfaces
// without channel information count as one queue, unless sysfs (which
// shows the namespace it was mounted in) lists more for the same name.
func RxQueues(ifindex int) (int, error) {
	ifc, err := net.InterfaceByIndex(ifindex)
	if err != nil {
		return 0, fmt.Errorf("afxdp: interface %d: %w", ifindex, err)
	}
	n, err := ethtoolRxQueues(ifc.Name)
	if err == nil && n > 0 {
		return n, nil
	}
	dir := filepath.Join("/sys/class/net", ifc.Name)
	if b, serr := os.ReadFile(filepath.Join(dir, "ifindex")); serr == nil && strings.TrimSpace(string(b)) == strconv.Itoa(ifindex) {
		if ents, _ := filepath.Glob(filepath.Join(dir, "queues", "rx-*")); len(ents) > 0 {
			return len(ents), nil
		}
	}
	return 1, nil
}

// ethtoolChannels is struct ethtool_channels.
type ethtoolChannels struct {
	Cmd                                         uint32
	MaxRx, MaxTx, MaxOther, MaxCombined         uint32
	RxCount, TxCount, OtherCount, CombinedCount uint32
}
