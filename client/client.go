// Package client lets an application in another process use the RNIC of a
// running softrnic daemon, the way it would use a hardware one through
// verbs: open the device, allocate PDs, register memory, create CQs and QPs,
// post work requests and poll completions.
//
// Control operations are messages on the daemon's Unix socket. The data path
// is shared memory: registered memory is a memfd the daemon maps too, so a
// remote RDMA READ or WRITE lands directly in the application's buffer; send
// and receive queues and completion queues are rings (package shmring) in
// memfds shared with the daemon, so PostSend, PostRecv and Poll are memory
// operations and make a syscall only to wake a daemon (or be woken by it)
// that has gone to sleep for lack of work.
//
// Handles are per connection: nothing a client names can reach another
// client's objects. When the connection closes (Close, or the process dies)
// the daemon moves the client's QPs to error and frees everything it owned.
package client

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/shmring"
)

// DefaultControl is the daemon socket Dial uses for an empty path.
const DefaultControl = proto.DefaultControl

// Client is a connection to the daemon: an open device context.
type Client struct {
	mu   sync.Mutex // serialises control calls
	conn *proto.Conn
	seq  uint32
	info proto.DeviceInfo
	db   *shmring.Doorbell // the daemon's pump doorbell

	closeOnce sync.Once
	closeErr  error
}

// Dial connects to the daemon at path (DefaultControl if empty) and opens
// its device.
func Dial(path string) (*Client, error) {
	if path == "" {
		path = DefaultControl
	}
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("softrnic: connecting to the daemon at %s: %w", path, err)
	}
	c := &Client{conn: proto.NewConn(uc)}
	body, fds, err := c.call(proto.OpOpen, &proto.OpenReq{Version: proto.Version}, 1)
	if err != nil {
		uc.Close()
		return nil, err
	}
	if err := proto.DecodeBody(body, &c.info); err != nil {
		proto.CloseFDs(fds)
		uc.Close()
		return nil, err
	}
	c.db = shmring.DoorbellFD(fds[0])
	return c, nil
}

// Info returns the device attributes the daemon reported.
func (c *Client) Info() proto.DeviceInfo { return c.info }

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
		c.closeErr = c.conn.Close()
		if c.db != nil {
			c.db.Close()
		}
	})
	return c.closeErr
}

// call sends one request and waits for its reply, which must carry nfds fds.
func (c *Client) call(op proto.Op, req any, nfds int, fds ...int) ([]byte, []int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	if err := c.conn.Send(proto.Header{Op: op, Seq: c.seq}, req, fds...); err != nil {
		return nil, nil, fmt.Errorf("softrnic %v: %w", op, err)
	}
	h, body, rfds, err := c.conn.Recv()
	if err != nil {
		return nil, nil, fmt.Errorf("softrnic %v: %w", op, err)
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
func (c *Client) AllocPD() (*PD, error) {
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
	LKey   uint32
	RKey   uint32
	Addr   uint64 // IOVA of the first byte (this process's address of it)
	Length uint64
}

// RegMR registers bytes [off, off+length) of m with the given access, at
// their address in this process.
func (p *PD) RegMR(m *Mem, off, length int, access ib.Access) (*MR, error) {
	return p.RegMRIOVA(m, off, length, m.Addr(off), access)
}

// RegMRIOVA registers bytes [off, off+length) of m at virtual address iova
// (ibv_reg_mr_iova): SGEs and peers name the memory by iova, which need not
// be where this process sees it (perftest's random base address, say).
func (p *PD) RegMRIOVA(m *Mem, off, length int, iova uint64, access ib.Access) (*MR, error) {
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
	return &MR{c: p.c, h: r.MR, LKey: r.LKey, RKey: r.RKey, Addr: req.IOVA, Length: req.Length}, nil
}

// Handle is the MR's handle on this connection.
func (m *MR) Handle() proto.Handle { return m.h }

// SGE names n bytes at offset off of the MR.
func (m *MR) SGE(off, n int) proto.SGE {
	return proto.SGE{Addr: m.Addr + uint64(off), Length: uint32(n), LKey: m.LKey}
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
func (c *Client) CreateCQ(depth int) (*CQ, error) {
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
		c.callHandle(proto.OpDestroyCQ, r.CQ)
		return nil, err
	}
	return &CQ{c: c, h: r.CQ, ring: ring, cons: ring.Consumer(), db: shmring.DoorbellFD(fds[1])}, nil
}

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
	q.ring.Close()
	return q.db.Close()
}

// QPInitAttr are the arguments of CreateQP (ibv_qp_init_attr).
type QPInitAttr struct {
	Type           proto.QPType
	SendCQ, RecvCQ *CQ
	Caps           proto.QPCaps
	SigAll         bool
}

// QP is a queue pair whose send and receive queues are shared-memory rings.
type QP struct {
	c    *Client
	h    proto.Handle
	QPN  uint32
	Type proto.QPType
	Caps proto.QPCaps // as granted

	sq, rq   *shmring.Ring
	smu, rmu sync.Mutex
	sqp, rqp *shmring.Producer
	state    proto.QPState
	stateMu  sync.Mutex
	cm       bool // made by rdma_cm (Connect, Accept): Disconnect applies
}

// CreateQP creates a queue pair in the PD.
func (p *PD) CreateQP(a QPInitAttr) (*QP, error) {
	if a.SendCQ == nil || a.RecvCQ == nil || a.SendCQ.c != p.c || a.RecvCQ.c != p.c {
		return nil, errors.New("softrnic: CreateQP needs send and receive CQs of the same client")
	}
	req := proto.CreateQPReq{PD: p.h, SendCQ: a.SendCQ.h, RecvCQ: a.RecvCQ.h, Type: a.Type, Caps: a.Caps}
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
	return p.mapQP(&r, fds, a.Type)
}

// Handle is the QP's handle on this connection.
func (q *QP) Handle() proto.Handle { return q.h }

// Modify changes QP attributes (ibv_modify_qp).
func (q *QP) Modify(attr *proto.QPAttr, mask proto.QPAttrMask) error {
	_, _, err := q.c.call(proto.OpModifyQP, &proto.ModifyQPReq{QP: q.h, Mask: mask, Attr: *attr}, 0)
	if err == nil && mask&proto.AttrState != 0 {
		q.stateMu.Lock()
		q.state = attr.State
		q.stateMu.Unlock()
	}
	return err
}

// Query returns the QP's attributes as the device holds them.
func (q *QP) Query() (proto.QPAttr, error) {
	body, _, err := q.c.call(proto.OpQueryQP, &proto.HandleMsg{Handle: q.h}, 0)
	var a proto.QPAttr
	if err == nil {
		err = proto.DecodeBody(body, &a)
	}
	return a, err
}

// Destroy destroys the QP.
func (q *QP) Destroy() error {
	if err := q.c.callHandle(proto.OpDestroyQP, q.h); err != nil {
		return err
	}
	q.sq.Close()
	return q.rq.Close()
}

// Errors of PostSend and PostRecv, as ibv_post_send returns them.
var (
	ErrQueueFull = fmt.Errorf("softrnic: work queue full: %w", unix.ENOMEM)
	ErrQPState   = fmt.Errorf("softrnic: QP state does not allow posting: %w", unix.EINVAL)
	ErrTooBig    = fmt.Errorf("softrnic: work request exceeds the QP's SGE or inline caps: %w", unix.EINVAL)
)

func (q *QP) currentState() proto.QPState {
	q.stateMu.Lock()
	s := q.state
	q.stateMu.Unlock()
	return s
}

// PostSend posts send work requests, publishing them together (one
// doorbell at most for the batch). It returns how many were posted and why
// it stopped early. Like ibv_post_send, a QP before RTS refuses; a QP in
// error accepts and the daemon flushes.
func (q *QP) PostSend(ws ...*proto.SendWR) (int, error) {
	st := q.currentState()
	if st != proto.RTS && st != proto.SQD && st != proto.SQE && st != proto.Err {
		return 0, ErrQPState
	}
	q.smu.Lock()
	defer q.smu.Unlock()
	n := 0
	var err error
	for _, w := range ws {
		if (w.Flags&ib.Inline != 0 && len(w.Inline) > int(q.Caps.MaxInline)) || (w.Flags&ib.Inline == 0 && len(w.SG) > int(q.Caps.MaxSendSGE)) {
			err = ErrTooBig
			break
		}
		s := q.sqp.Reserve()
		if s == nil {
			err = ErrQueueFull
			break
		}
		if err = proto.PutSendWR(s, w); err != nil {
			q.sqp.Unreserve()
			break
		}
		n++
	}
	if n > 0 {
		if _, cerr := q.sqp.Commit(); cerr != nil && err == nil {
			err = cerr
		}
	}
	return n, err
}

// RecvBacklog is how many posted receives the daemon has not yet handed to
// its device. ibv_post_recv returns with the receive in the RQ; here it is
// on its way through the ring, normally for microseconds. A receive that a
// peer's UC or UD SEND must find (no RNR retry there) is certain to be in
// place only once this is 0: wait for that before telling the peer to send.
func (q *QP) RecvBacklog() int {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	return q.rq.Geometry().Slots - q.rqp.Free()
}

// PostRecv posts receive work requests, publishing them together.
func (q *QP) PostRecv(ws ...*proto.RecvWR) (int, error) {
	if q.currentState() == proto.Reset {
		return 0, ErrQPState
	}
	q.rmu.Lock()
	defer q.rmu.Unlock()
	n := 0
	var err error
	for _, w := range ws {
		if len(w.SG) > int(q.Caps.MaxRecvSGE) {
			err = ErrTooBig
			break
		}
		s := q.rqp.Reserve()
		if s == nil {
			err = ErrQueueFull
			break
		}
		proto.PutRecvWR(s, w)
		n++
	}
	if n > 0 {
		if _, cerr := q.rqp.Commit(); cerr != nil && err == nil {
			err = cerr
		}
	}
	return n, err
}
