package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/shmring"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/verbs"
)

// DefaultControl is the daemon socket Dial uses for an empty path.
const DefaultControl = proto.DefaultControl

// Client is a connection to the daemon: an open device context.
type Client struct {
	mu   sync.Mutex // serialises control calls
	conn *proto.Conn
	seq  uint32
	info proto.DeviceInfo
	db   *shmring.Doorbell // this client's doorbell to the daemon's engine

	// Poll's view of the CQs: their rings, and their doorbells in one
	// epoll set (edge-triggered: nothing to drain).
	cqMu     sync.Mutex
	pollCQs  []*CQ
	epfd     int
	pollMu   sync.Mutex // one Poll sleeps at a time
	epEvents [4]unix.EpollEvent
	flowing  bool // the last Poll found a completion (under pollMu)
	// Doorbells counts the posts that rang the daemon's engine (it was
	// asleep), Sleeps the Polls that slept, and Yields the CPU given away
	// by Polls while completions flow: the syscalls that posting and
	// polling cost.
	Doorbells, Sleeps, Yields atomic.Uint64

	cmMu sync.Mutex // guards cmev's creation
	cmev *cmEvents  // the rdma_cm event channel (cm.go), made on first use

	// Asynchronous events (events.go): the objects events name, by
	// handle, and the reader of the event socket.
	objMu     sync.Mutex
	cqs       map[proto.Handle]*CQ
	srqs      map[proto.Handle]*SRQ
	evOnce    sync.Once
	events    chan verbs.AsyncEvent
	evConn    *net.UnixConn
	evQuit    chan struct{}
	evDone    chan struct{}
	lost      atomic.Uint64 // events the daemon dropped for this client
	portState atomic.Int32  // 0: as OPEN said; 1 active, 2 down, from port events

	closeOnce sync.Once
	closeErr  error
}

// Dial connects to the daemon at path (DefaultControl if empty) and opens
// its device.
func Dial(path string) (*Client, error) {
	if path == "" {
		path = DefaultControl
	}
	uc, err := dialUnix(path)
	if err != nil {
		return nil, fmt.Errorf("softrnic: connecting to the daemon at %s: %w", path, err)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("softrnic: epoll: %w", err)
	}
	c := &Client{conn: proto.NewConn(uc), epfd: epfd, cqs: map[proto.Handle]*CQ{}, srqs: map[proto.Handle]*SRQ{}}
	body, fds, err := c.call(proto.OpOpen, &proto.OpenReq{Version: proto.Version}, 1)
	if err != nil {
		uc.Close()
		unix.Close(epfd)
		return nil, err
	}
	if err := proto.DecodeBody(body, &c.info); err != nil {
		proto.CloseFDs(fds)
		uc.Close()
		unix.Close(epfd)
		return nil, err
	}
	c.db = shmring.DoorbellFD(fds[0])
	return c, nil
}

// connectWait bounds how long Dial waits for room in the daemon's listen
// queue.
const connectWait = 5 * time.Second

// dialUnix connects to the daemon's socket. A full listen queue (the
// daemon busy accepting, or turning away a flood of connections) fails a
// non-blocking connect with EAGAIN where a blocking one would wait: Dial
// waits too, a while.
func dialUnix(path string) (*net.UnixConn, error) {
	pause := time.Millisecond
	deadline := time.Now().Add(connectWait)
	for {
		uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err == nil || !errors.Is(err, unix.EAGAIN) || time.Now().After(deadline) {
			return uc, err
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// Info returns the device attributes the daemon reported.
func (c *Client) Info() proto.DeviceInfo { return c.info }

var _ verbs.Device = (*Client)(nil)

// Name is the interface the daemon's RNIC runs on.
func (c *Client) Name() string { return string(bytes.TrimRight(c.info.Name[:], "\x00")) }

// Query returns the daemon's device attributes (ibv_query_device), as
// OPEN reported them; PortActive follows the port events once Events runs.
func (c *Client) Query() ib.DeviceAttr {
	a := c.info.DeviceAttr
	switch c.portState.Load() {
	case 1:
		a.PortActive = true
	case 2:
		a.PortActive = false
	}
	return a
}

// GIDs is the daemon's GID table.
func (c *Client) GIDs() []netip.Addr {
	var g []netip.Addr
	for i := 0; i < int(c.info.NumGIDs) && i < len(c.info.GIDs); i++ {
		g = append(g, netip.AddrFrom16(c.info.GIDs[i]).Unmap())
	}
	return g
}

// AllocMem allocates memory the daemon can map (see AllocMem).
func (c *Client) AllocMem(n int) (verbs.Mem, error) { return AllocMem(n) }

// Status returns how the daemon moves frames and who uses it (all clients
// for root, only this one for others): what softrnic status prints.
func (c *Client) Status() (proto.StatusResp, error) {
	var r proto.StatusResp
	body, _, err := c.call(proto.OpStatus, nil, 0)
	if err == nil {
		err = proto.DecodeBody(body, &r)
	}
	return r, err
}

// Close closes the connection; the daemon releases everything this client
// created. Objects of the client must not be used afterwards. Safe to call
// more than once and from any goroutine (a tool's context ending aborts a
// waiting rdma_cm call by closing the client).
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.stopEvents() // first: the daemon's end-of-file is then no DEVICE_FATAL
		c.closeErr = c.conn.Close()
		if c.db != nil {
			c.db.Close()
		}
		c.pollMu.Lock() // no Poll sleeps on the epoll set any more
		unix.Close(c.epfd)
		c.epfd = -1
		c.pollMu.Unlock()
		c.cmMu.Lock()
		if c.cmev != nil {
			c.cmev.sock.Close() // its reader ends; waiting calls fail
		}
		c.cmMu.Unlock()
	})
	return c.closeErr
}

// call sends one request and waits for its reply, which must carry nfds fds.
func (c *Client) call(op proto.Op, req any, nfds int, fds ...int) ([]byte, []int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	if err := c.conn.Send(proto.Header{Op: op, Seq: c.seq}, req, fds...); err != nil {
		if rerr := c.refusal(op); rerr != nil {
			return nil, nil, rerr
		}
		return nil, nil, fmt.Errorf("softrnic %v: %w", op, err)
	}
	h, body, rfds, err := c.conn.Recv()
	if err != nil {
		if rerr := c.refusal(op); rerr != nil {
			return nil, nil, rerr
		}
		return nil, nil, fmt.Errorf("softrnic %v: %w", op, err)
	}
	if op == proto.OpOpen && h.Op == op && h.Seq == 0 && h.Errno != 0 {
		proto.CloseFDs(rfds)
		return nil, nil, &proto.Error{Op: op, Errno: unix.Errno(h.Errno), Msg: string(body)}
	}
	if h.Op != op || h.Seq != c.seq {
		proto.CloseFDs(rfds)
		return nil, nil, fmt.Errorf("softrnic %v: reply for %v #%d", op, h.Op, h.Seq)
	}
	if h.Errno != 0 {
		proto.CloseFDs(rfds)
		return nil, nil, &proto.Error{Op: op, Errno: unix.Errno(h.Errno), Msg: string(body)}
	}
	if len(rfds) != nfds {
		proto.CloseFDs(rfds)
		return nil, nil, fmt.Errorf("softrnic %v: reply carries %d fds, want %d", op, len(rfds), nfds)
	}
	return body, rfds, nil
}

// refusal returns the daemon's refusal of a connection (not allowed, over
// a limit, out of file descriptors): an OPEN reply with Seq 0 it sends at
// once and then closes, so that the OPEN itself may fail to send, or its
// reply to arrive after a reset. Nil for any other failure.
func (c *Client) refusal(op proto.Op) error {
	if op != proto.OpOpen {
		return nil
	}
	// (A deadline on an open socket cannot fail.)
	_ = c.conn.UnixConn().SetReadDeadline(time.Now().Add(time.Second))
	defer func() { _ = c.conn.UnixConn().SetReadDeadline(time.Time{}) }()
	for i := 0; i < 2; i++ {
		h, body, fds, err := c.conn.Recv()
		proto.CloseFDs(fds)
		if err == nil && h.Op == proto.OpOpen && h.Seq == 0 && h.Errno != 0 {
			return &proto.Error{Op: op, Errno: unix.Errno(h.Errno), Msg: string(body)}
		}
		if err == nil || !errors.Is(err, unix.ECONNRESET) {
			return nil
		}
	}
	return nil
}

func (c *Client) callHandle(op proto.Op, h proto.Handle) error {
	_, _, err := c.call(op, &proto.HandleMsg{Handle: h}, 0)
	return err
}

// PD is a protection domain.
type PD struct {
	c *Client
	h proto.Handle
}

// AllocPD allocates a protection domain.
func (c *Client) AllocPD() (verbs.PD, error) {
	body, _, err := c.call(proto.OpAllocPD, nil, 0)
	if err != nil {
		return nil, err
	}
	var m proto.HandleMsg
	if err := proto.DecodeBody(body, &m); err != nil {
		return nil, err
	}
	return &PD{c, m.Handle}, nil
}

// Handle is the PD's handle on this connection.
func (p *PD) Handle() proto.Handle { return p.h }

// Dealloc frees the PD; its MRs and QPs must be gone first.
func (p *PD) Dealloc() error { return p.c.callHandle(proto.OpDeallocPD, p.h) }

// Mem is memory the daemon can map: a sealed memfd mapped into this process.
// Register parts of it with PD.RegMR.
type Mem struct {
	fd int
	b  []byte
}

// AllocMem allocates size bytes of shareable memory (rounded up to pages).
// It is sealed against shrinking and growing so that the daemon's mapping of
// it can never fault.
func AllocMem(size int) (*Mem, error) {
	if size <= 0 {
		return nil, errors.New("softrnic: AllocMem of no bytes")
	}
	pg := unix.Getpagesize()
	size = (size + pg - 1) / pg * pg
	fd, err := unix.MemfdCreate("softrnic-mr", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("softrnic: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, err
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Mem{fd: fd, b: b}, nil
}

// Bytes is the memory.
func (m *Mem) Bytes() []byte { return m.b }

// Addr is the virtual address of byte off of the memory: what SGEs and
// remote peers (with an rkey) use to name it.
func (m *Mem) Addr(off int) uint64 { return uint64(uintptrOf(m.b)) + uint64(off) }

// Free unmaps the memory. MRs on it should be deregistered first; the
// daemon keeps its own mapping until then, so freeing early is safe for the
// daemon, only pointless for the application.
func (m *Mem) Free() error {
	err := unix.Munmap(m.b)
	unix.Close(m.fd)
	m.b = nil
	return err
}

// MR is a registered memory region.
type MR struct {
	c      *Client
	h      proto.Handle
	lkey   uint32
	rkey   uint32
	addr   uint64 // IOVA of the first byte
	length uint64
}

var _ verbs.MR = (*MR)(nil)

// LKey is the region's local key; RKey, IOVA and Len describe the rest.
func (m *MR) LKey() uint32 { return m.lkey }
func (m *MR) RKey() uint32 { return m.rkey }
func (m *MR) IOVA() uint64 { return m.addr }
func (m *MR) Len() int     { return int(m.length) }

// RegMR registers bytes [off, off+length) of mem, memory from AllocMem, at
// virtual address iova (0: their address in this process; ibv_reg_mr_iova):
// SGEs and peers name the memory by iova, which need not be where this
// process sees it (perftest's random base address, say).
func (p *PD) RegMR(mem verbs.Mem, off, length int, iova uint64, access ib.Access) (verbs.MR, error) {
	m, ok := mem.(*Mem)
	if !ok {
		return nil, fmt.Errorf("softrnic: the daemon registers memory from its AllocMem only: %w", verbs.ErrInvalid)
	}
	if iova == 0 {
		iova = m.Addr(off)
	}
	if off < 0 || length <= 0 || off+length > len(m.b) {
		return nil, fmt.Errorf("softrnic: MR [%d, %d) outside the %d-byte memory", off, off+length, len(m.b))
	}
	req := proto.RegMRReq{PD: p.h, Access: access, Offset: uint64(off), Length: uint64(length), IOVA: iova}
	body, _, err := p.c.call(proto.OpRegMR, &req, 0, m.fd)
	if err != nil {
		return nil, err
	}
	var r proto.RegMRResp
	if err := proto.DecodeBody(body, &r); err != nil {
		return nil, err
	}
	return &MR{c: p.c, h: r.MR, lkey: r.LKey, rkey: r.RKey, addr: req.IOVA, length: req.Length}, nil
}

// Handle is the MR's handle on this connection.
func (m *MR) Handle() proto.Handle { return m.h }

// SGE names n bytes at offset off of the MR.
func (m *MR) SGE(off, n int) ib.SGE {
	return ib.SGE{Addr: m.addr + uint64(off), Length: uint32(n), LKey: m.lkey}
}

// Dereg deregisters the MR: once it returns, no access reaches the memory.
func (m *MR) Dereg() error { return m.c.callHandle(proto.OpDeregMR, m.h) }

// CQ is a completion queue whose entries arrive in a shared-memory ring.
type CQ struct {
	c    *Client
	h    proto.Handle
	ring *shmring.Ring
	mu   sync.Mutex
	cons *shmring.Consumer
	db   *shmring.Doorbell
}

// CreateCQ creates a completion queue holding at least depth completions.
func (c *Client) CreateCQ(depth int) (verbs.CQ, error) {
	if depth <= 0 {
		return nil, errors.New("softrnic: CQ depth must be positive")
	}
	body, fds, err := c.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: uint32(depth)}, 2)
	if err != nil {
		return nil, err
	}
	var r proto.CreateCQResp
	if err := proto.DecodeBody(body, &r); err != nil {
		proto.CloseFDs(fds)
		return nil, err
	}
	ring, err := shmring.Map(fds[0], shmring.Geometry{SlotSize: proto.CQESize, Slots: int(r.Slots)})
	if err != nil {
		unix.Close(fds[1])
		return nil, errors.Join(err, c.callHandle(proto.OpDestroyCQ, r.CQ))
	}
	q := &CQ{c: c, h: r.CQ, ring: ring, cons: ring.Consumer(), db: shmring.DoorbellFD(fds[1])}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(q.db.FD())}
	if err := unix.EpollCtl(c.epfd, unix.EPOLL_CTL_ADD, q.db.FD(), &ev); err != nil {
		return nil, errors.Join(fmt.Errorf("softrnic: epoll: %w", err), q.ring.Close(), q.db.Close(), c.callHandle(proto.OpDestroyCQ, r.CQ))
	}
	c.cqMu.Lock()
	c.pollCQs = append(c.pollCQs, q)
	c.cqMu.Unlock()
	c.objMu.Lock()
	c.cqs[q.h] = q
	c.objMu.Unlock()
	return q, nil
}

// Poll is what an application busy-polling its CQs calls when it found
// them empty (verbs.Poller): it waits until one of the client's CQs holds
// a completion, looking again and again for a moment, then asleep for at
// most pollWait, and reports whether one came. While completions flow
// (the last Poll found one) the moment is pollFlowing and the CPU goes to
// any other runnable thread between looks: on a small host that is the
// daemon's engine, which must run for the completion to come, and a
// completion found this way costs no wake-up. Otherwise it is pollSpin,
// without yielding, so that an idle application sleeps at once. The sleep
// arms the CQ rings' wakeup flags, so the daemon rings this client's CQ
// doorbells for its next completion. It does not see a peer's RDMA WRITE
// landing in memory: an application watching memory keeps polling
// without it.
func (c *Client) Poll() bool {
	c.pollMu.Lock() // CQ.Destroy waits for it before it unmaps a ring
	defer c.pollMu.Unlock()
	c.cqMu.Lock()
	cqs := c.pollCQs
	c.cqMu.Unlock()
	ready := func() bool {
		for _, q := range cqs {
			if !q.ring.Empty() {
				return true
			}
		}
		return false
	}
	spin := pollSpin
	if c.flowing {
		spin = pollFlowing
	}
	for start := clock.Now(); clock.Now().Sub(start) < spin; {
		if ready() {
			c.flowing = true
			return true
		}
		if c.flowing {
			c.Yields.Add(1)
			port.Yield()
		}
	}
	c.flowing = false
	if c.epfd < 0 {
		return false
	}
	armed := true
	for _, q := range cqs {
		armed = q.ring.Arm() && armed
	}
	if armed {
		c.Sleeps.Add(1)
		// A wake-up, a signal (EINTR) and the bound all end the sleep:
		// the rings say what came.
		_, _ = unix.EpollWait(c.epfd, c.epEvents[:], int(pollWait/time.Millisecond))
	}
	for _, q := range cqs {
		q.ring.Disarm()
	}
	c.flowing = ready()
	return c.flowing
}

// Poll's spin, its spin while completions flow (the README's design
// decision "Through the daemon" has the figures), and its longest sleep:
// a sleep ends with the next completion, the bound only limits how long
// an application that waits for something else (a deadline, a stall
// check) sleeps.
const (
	pollSpin    = 2 * time.Microsecond
	pollFlowing = 50 * time.Microsecond
	pollWait    = time.Millisecond
)

// Handle is the CQ's handle on this connection.
func (q *CQ) Handle() proto.Handle { return q.h }

// Poll moves up to len(wcs) completions into wcs and returns how many. No
// syscall, no allocation.
func (q *CQ) Poll(wcs []ib.WC) int {
	q.mu.Lock()
	n := 0
	for ; n < len(wcs); n++ {
		s := q.cons.Peek()
		if s == nil {
			break
		}
		proto.GetWC(s, &wcs[n])
	}
	q.cons.Release()
	q.mu.Unlock()
	return n
}

// Wait blocks until the CQ holds a completion or timeout passes (negative:
// no limit). Use it after Poll found nothing for a while: the daemon then
// rings this CQ's doorbell when it next adds a completion.
func (q *CQ) Wait(timeout time.Duration) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.cons.Sleep(q.db, timeout)
}

// Err reports a corrupted ring (the daemon published an impossible index).
func (q *CQ) Err() error { return q.cons.Err() }

// Destroy destroys the CQ; QPs using it must be destroyed first.
func (q *CQ) Destroy() error {
	if err := q.c.callHandle(proto.OpDestroyCQ, q.h); err != nil {
		return err
	}
	c := q.c
	c.objMu.Lock()
	delete(c.cqs, q.h)
	c.objMu.Unlock()
	c.cqMu.Lock()
	c.pollCQs = slices.DeleteFunc(slices.Clone(c.pollCQs), func(x *CQ) bool { return x == q })
	c.cqMu.Unlock()
	c.pollMu.Lock() // no Poll uses the ring or the fd any more
	var err error
	if c.epfd >= 0 {
		err = unix.EpollCtl(c.epfd, unix.EPOLL_CTL_DEL, q.db.FD(), nil)
	}
	err = errors.Join(err, q.ring.Close(), q.db.Close())
	c.pollMu.Unlock()
	return err
}

// QP is a queue pair whose send and receive queues are shared-memory rings.
type QP struct {
	c    *Client
	h    proto.Handle
	qpn  uint32
	typ  ib.QPType
	caps ib.QPCaps // as granted

	sq, rq   *shmring.Ring
	smu, rmu sync.Mutex
	sqp, rqp *shmring.Producer
	// destroyed is set, with smu and rmu held, when Destroy unmaps the
	// rings: a post after it fails instead of touching them.
	destroyed bool
	srq       *SRQ // receives come from here, or nil
	state     ib.QPState
	stateMu   sync.Mutex
}

var _ verbs.QP = (*QP)(nil)

// CreateQP creates a queue pair in the PD; its CQs are this client's.
func (p *PD) CreateQP(a *verbs.QPInitAttr) (verbs.QP, error) {
	scq, ok1 := a.SendCQ.(*CQ)
	rcq, ok2 := a.RecvCQ.(*CQ)
	if !ok1 || !ok2 || scq.c != p.c || rcq.c != p.c {
		return nil, fmt.Errorf("softrnic: CreateQP needs send and receive CQs of the same client: %w", verbs.ErrOtherDevice)
	}
	req := proto.CreateQPReq{PD: p.h, SendCQ: scq.h, RecvCQ: rcq.h, Type: a.Type, Caps: a.Cap, Recovery: a.Recovery}
	var srq *SRQ
	if a.SRQ != nil {
		var ok bool
		if srq, ok = a.SRQ.(*SRQ); !ok || srq.c != p.c {
			return nil, fmt.Errorf("softrnic: CreateQP needs an SRQ of the same client: %w", verbs.ErrOtherDevice)
		}
		req.SRQ = srq.h
	}
	if a.SigAll {
		req.SigAll = 1
	}
	body, fds, err := p.c.call(proto.OpCreateQP, &req, 2)
	if err != nil {
		return nil, err
	}
	var r proto.CreateQPResp
	if err := proto.DecodeBody(body, &r); err != nil {
		proto.CloseFDs(fds)
		return nil, err
	}
	q, err := p.mapQP(&r, fds, a.Type)
	if err != nil {
		return nil, err
	}
	q.srq = srq
	return q, nil
}

// mapQP maps the rings of a QP the daemon created and returns it.
func (p *PD) mapQP(r *proto.CreateQPResp, fds []int, typ ib.QPType) (*QP, error) {
	sq, err := shmring.Map(fds[0], shmring.Geometry{SlotSize: proto.SendSlotSize(r.Caps), Slots: int(r.SQSlots)})
	if err != nil {
		unix.Close(fds[1])
		return nil, errors.Join(err, p.c.callHandle(proto.OpDestroyQP, r.QP))
	}
	rq, err := shmring.Map(fds[1], shmring.Geometry{SlotSize: proto.RecvSlotSize(r.Caps), Slots: int(r.RQSlots)})
	if err != nil {
		sq.Close()
		return nil, errors.Join(err, p.c.callHandle(proto.OpDestroyQP, r.QP))
	}
	return &QP{c: p.c, h: r.QP, qpn: r.QPN, typ: typ, caps: r.Caps, sq: sq, rq: rq,
		sqp: sq.Producer(p.c.db), rqp: rq.Producer(p.c.db)}, nil
}

// AH is an address handle: a daemon object (its device's AH, the next
// hop's MAC resolved) that the UD WRs posted with it name.
type AH struct {
	c  *Client
	h  proto.Handle
	av ib.AddressVector
}

var _ verbs.AH = (*AH)(nil)

// CreateAH makes an address handle (ibv_create_ah) in the PD; the daemon
// resolves the destination's MAC, which may take an ARP exchange.
func (p *PD) CreateAH(av *ib.AddressVector) (verbs.AH, error) {
	body, _, err := p.c.call(proto.OpCreateAH, &proto.CreateAHReq{PD: p.h, AV: *av}, 0)
	if err != nil {
		return nil, err
	}
	var m proto.HandleMsg
	if err := proto.DecodeBody(body, &m); err != nil {
		return nil, err
	}
	return &AH{c: p.c, h: m.Handle, av: *av}, nil
}

// AV is the address vector the handle was made from.
func (a *AH) AV() ib.AddressVector { return a.av }

// Handle is the AH's handle on this connection.
func (a *AH) Handle() proto.Handle { return a.h }

// Destroy releases the handle (ibv_destroy_ah). A UD WR posted with it
// before and still in the SQ ring completes in error.
func (a *AH) Destroy() error { return a.c.callHandle(proto.OpDestroyAH, a.h) }

// Handle is the QP's handle on this connection.
func (q *QP) Handle() proto.Handle { return q.h }

// Device is the client the QP belongs to (verbs.DeviceObject).
func (q *QP) Device() verbs.Device { return q.c }

// QPN is the QP's number.
func (q *QP) QPN() uint32 { return q.qpn }

// Type is the QP's transport service.
func (q *QP) Type() ib.QPType { return q.typ }

// Caps are the QP's queue sizes as the daemon granted them.
func (q *QP) Caps() ib.QPCaps { return q.caps }

// State is the QP's state as this client last moved it (the daemon may
// have moved it to SQE or ERR since: Query says).
func (q *QP) State() ib.QPState {
	q.stateMu.Lock()
	defer q.stateMu.Unlock()
	return q.state
}

func (q *QP) setState(s ib.QPState) {
	q.stateMu.Lock()
	q.state = s
	q.stateMu.Unlock()
}

// Modify changes QP attributes (ibv_modify_qp): attributes and mask go to
// the daemon's device as they are.
func (q *QP) Modify(attr *ib.QPAttr, mask ib.QPAttrMask) error {
	_, _, err := q.c.call(proto.OpModifyQP, &proto.ModifyQPReq{QP: q.h, Mask: mask, Attr: *attr}, 0)
	if err == nil && mask&ib.AttrState != 0 {
		q.setState(attr.State)
	}
	return err
}

// Query returns the QP's attributes as the device holds them.
func (q *QP) Query() (ib.QPAttr, error) {
	body, _, err := q.c.call(proto.OpQueryQP, &proto.HandleMsg{Handle: q.h}, 0)
	var a ib.QPAttr
	if err == nil {
		err = proto.DecodeBody(body, &a)
	}
	if err == nil {
		q.setState(a.State)
	}
	return a, err
}

// Destroy destroys the QP.
func (q *QP) Destroy() error {
	if err := q.c.callHandle(proto.OpDestroyQP, q.h); err != nil {
		return err
	}
	q.smu.Lock()
	q.rmu.Lock()
	defer q.smu.Unlock()
	defer q.rmu.Unlock()
	q.destroyed = true
	q.sq.Close()
	return q.rq.Close()
}

// PostSend posts send work requests, publishing them together (one
// doorbell at most for the batch). It returns how many were posted and why
// it stopped early. Like ibv_post_send, a QP before RTS refuses; a QP in
// error accepts and the daemon flushes. No syscall, no allocation.
func (q *QP) PostSend(ws []verbs.SendWR) (int, error) {
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.destroyed && len(ws) > 0 {
		return 0, q.wrError(verbs.QueueSQ, 0, ws[0].ID, verbs.ErrDestroyed, "the QP is destroyed")
	}
	st := q.State()
	if st != ib.RTS && st != ib.SQD && st != ib.SQE && st != ib.Err && len(ws) > 0 {
		return 0, q.wrError(verbs.QueueSQ, 0, ws[0].ID, verbs.ErrQPState, "the QP is in %v; sends need RTS, SQD, SQE or ERR", st)
	}
	n := 0
	var err error
	for i := range ws {
		w := &ws[i]
		if w.Flags&ib.Inline != 0 && len(w.InlineData) > int(q.caps.MaxInline) {
			err = q.wrError(verbs.QueueSQ, i, w.ID, verbs.ErrInlineSize, "%d bytes inline, max_inline_data %d", len(w.InlineData), q.caps.MaxInline)
			break
		}
		if w.Flags&ib.Inline == 0 && len(w.SG) > int(q.caps.MaxSendSGE) {
			err = q.wrError(verbs.QueueSQ, i, w.ID, verbs.ErrTooManySGE, "%d SGEs, max_send_sge %d", len(w.SG), q.caps.MaxSendSGE)
			break
		}
		var ah proto.Handle
		if q.typ == ib.UD {
			a, ok := w.AH.(*AH)
			if !ok || a.c != q.c {
				err = q.wrError(verbs.QueueSQ, i, w.ID, verbs.ErrInvalid, "no address handle of this client")
				break
			}
			ah = a.h
		}
		s := q.sqp.Reserve()
		if s == nil {
			err = verbs.ErrQueueFull
			break
		}
		if err = proto.PutSendWR(s, w, ah); err != nil {
			q.sqp.Unreserve()
			break
		}
		n++
	}
	if n > 0 {
		q.commit(q.sqp, &err)
	}
	return n, err
}

// commit publishes what a post reserved, counting a doorbell it rang.
func (q *QP) commit(p *shmring.Producer, err *error) {
	rang, cerr := p.Commit()
	if rang {
		q.c.Doorbells.Add(1)
	}
	if cerr != nil && *err == nil {
		*err = cerr
	}
}

// wrError is the WRError of WR i (wr_id id) of a post to queue qu of q.
func (q *QP) wrError(qu verbs.Queue, i int, id uint64, kind error, format string, args ...any) error {
	return &verbs.WRError{QPN: q.qpn, Queue: qu, Index: i, ID: id, Detail: fmt.Sprintf(format, args...), Err: kind}
}

// RecvBacklog is how many posted receives the daemon has not yet handed to
// its device. ibv_post_recv returns with the receive in the RQ; here it is
// on its way through the ring, normally for microseconds. A receive that a
// peer's UC or UD SEND must find (no RNR retry there) is certain to be in
// place only once this is 0: SyncRecv waits for that.
func (q *QP) RecvBacklog() int {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if q.destroyed {
		return 0
	}
	return q.rq.Geometry().Slots - q.rqp.Free()
}

// SyncRecv implements verbs.RecvSyncer: it returns once the daemon's
// device holds every receive posted so far, yielding the CPU meanwhile.
func (q *QP) SyncRecv(ctx context.Context) error {
	for q.RecvBacklog() > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("softrnic: QP %#x: %d receives not taken by the daemon: %w", q.qpn, q.RecvBacklog(), err)
		}
		time.Sleep(10 * time.Microsecond)
	}
	return nil
}

// PostRecv posts receive work requests, publishing them together.
func (q *QP) PostRecv(ws []verbs.RecvWR) (int, error) {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if q.destroyed && len(ws) > 0 {
		return 0, q.wrError(verbs.QueueRQ, 0, ws[0].ID, verbs.ErrDestroyed, "the QP is destroyed")
	}
	if q.srq != nil && len(ws) > 0 {
		return 0, q.wrError(verbs.QueueRQ, 0, ws[0].ID, verbs.ErrNoRecvQueue, "the QP receives from an SRQ")
	}
	if q.State() == ib.Reset && len(ws) > 0 {
		return 0, q.wrError(verbs.QueueRQ, 0, ws[0].ID, verbs.ErrQPState, "the QP is in RESET")
	}
	n := 0
	var err error
	for i := range ws {
		if len(ws[i].SG) > int(q.caps.MaxRecvSGE) {
			err = q.wrError(verbs.QueueRQ, i, ws[i].ID, verbs.ErrTooManySGE, "%d SGEs, max_recv_sge %d", len(ws[i].SG), q.caps.MaxRecvSGE)
			break
		}
		s := q.rqp.Reserve()
		if s == nil {
			err = verbs.ErrQueueFull
			break
		}
		_ = proto.PutRecvWR(s, &ws[i]) // it fits: the slot holds MaxRecvSGE entries, checked above
		n++
	}
	if n > 0 {
		q.commit(q.rqp, &err)
	}
	return n, err
}
