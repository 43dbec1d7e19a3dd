package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/internal/shmring"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// session is one client connection and everything it created. Handles index
// the session's own maps, so a client can only ever name its own objects.
type session struct {
	s    *Server
	id   uint64
	cred unix.Ucred
	conn *proto.Conn
	log  *slog.Logger

	mu     sync.Mutex // guards the maps (read by Server.Clients and Close)
	opened bool
	next   proto.Handle
	pds    map[proto.Handle]*pdObj
	mrs    map[proto.Handle]*mrObj
	cqs    map[proto.Handle]*cqObj
	qps    map[proto.Handle]*qpObj
	srqs   map[proto.Handle]*srqObj
	// ahs are written under both mu and ahMu, and read by the engine
	// under ahMu alone: a control operation holding mu (an mmap, a device
	// call) never stalls the engine.
	ahMu   sync.Mutex
	ahs    map[proto.Handle]*ahObj
	spaces map[proto.Handle]*addrSpaceObj // the client's address spaces (procmem.go)
	// acct is what the client holds against the limits (limits.go).
	acct *account
	// netRaw: the client may set controlled Q_Keys (CAP_NET_RAW).
	netRaw bool
	// maps are the mappings of the client's memfds its MRs share;
	// graves are those no MR uses any more, already detached from the
	// client's memory, unmapped once no QP of the session can hold a
	// reference into them (mappings.go).
	maps    map[fileKey][]*memfdMap
	graves  []grave
	liveQPs int // QPs created and not yet destroyed in the device
	// liveSRQs likewise: their posted receives point into MRs too.
	liveSRQs int
	// sent are rings whose memfd the client gets in the reply being
	// made: the daemon closes its own fd once the reply went, keeping
	// only the mapping (serve's goroutine only).
	sent       []*shmring.Ring
	capture    *capture.Session
	db         *shmring.Doorbell // this client's doorbell to the engine (rung by posts it sleeps through)
	events     eventSink         // the event socket (async.go)
	afterReply []int             // fds to close once the reply carrying them is sent

	// rdma_cm for librdmacm (ucm.go): the client's event channels and IDs,
	// guarded by the service's lock; ucmObjects counts them (guarded by
	// mu) against the objects-per-conn limit.
	ucm        *ucmSession
	ucmObjects int
}

// The session's objects hold the device's own types (asserted once, when
// created), so that the data path makes no interface calls.
type pdObj struct {
	pd   *rnic.PD
	refs int // MRs, QPs and AHs in it
}

type ahObj struct {
	ah *rnic.AH
	pd *pdObj
}

type mrObj struct {
	mr  *rnic.MR
	pd  *pdObj
	mem *memfdMap // the mapping it is in (an MR of a memfd)
	// space is the address space of an MR of OpRegMRAddr, which holds
	// length bytes of MRBytes itself (no mapping shares them).
	space  *addrSpaceObj
	length int64
}

type cqObj struct {
	owner *session
	h     proto.Handle
	cq    *rnic.CQ
	ring  *shmring.Ring
	db    *shmring.Doorbell // the client's: rung when it sleeps on the CQ
	sink  cqSink
	refs  int      // QPs using it
	held  []charge // against the limits
}

type qpObj struct {
	owner      *session
	h          proto.Handle
	qp         *rnic.QP
	srq        *srqObj // the SRQ it takes receives from, or nil
	typ        ib.QPType
	pd         *pdObj
	send, recv *cqObj
	sq, rq     *shmring.Ring
	// The rest is the engine's (rings.go): the rings' consumer sides, WR
	// decode buffers (reused: no allocation per WR), a ring corrupted by
	// the client, the send WRs noted at the start of a Fetch, rings
	// whose WRs the device had no room for, and the send WR posted in
	// error that waits at the head of the ring for room, counted already.
	sqc, rqc             *shmring.Consumer
	swr                  [fetchBatch]verbs.SendWR
	rwr                  [fetchBatch]verbs.RecvWR
	broken               bool
	sqReady              int
	sqBlocked, rqBlocked bool
	badWaiting           bool
	badWaitingID         uint64
	// rqMu serialises the RQ ring's consumer (rqc, rwr) between Fetch
	// and the device's refill (refillRQ).
	rqMu sync.Mutex
	held []charge // against the limits
}

// errno is an error with the errno the client receives.
type errno struct {
	no  unix.Errno
	msg string
}

func (e *errno) Error() string { return e.msg }

func errf(no unix.Errno, format string, args ...any) error {
	return &errno{no, fmt.Sprintf(format, args...)}
}

// errnoOf is the one place a failure becomes what the client receives:
// the errno of the daemon's own refusal (errf, a limit) or of the device's
// verbs error kind (verbs.Error), a system call's (out of file
// descriptors: EMFILE), EINVAL for anything else, and the message.
func errnoOf(err error) (unix.Errno, string) {
	var e *errno
	if errors.As(err, &e) {
		return e.no, e.msg
	}
	var k interface{ Errno() syscall.Errno }
	if errors.As(err, &k) {
		return k.Errno(), err.Error()
	}
	var no syscall.Errno
	if errors.As(err, &no) {
		return no, err.Error()
	}
	return unix.EINVAL, err.Error()
}

// startSession serves an admitted connection; acc already holds it.
func (s *Server) startSession(c *net.UnixConn, cr *unix.Ucred, acc *account) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		acc.leave()
		c.Close()
		return
	}
	s.nextID++
	ss := &session{s: s, id: s.nextID, cred: *cr, conn: proto.NewConn(c), acct: acc, netRaw: hasNetRaw(cr),
		pds: map[proto.Handle]*pdObj{}, mrs: map[proto.Handle]*mrObj{}, cqs: map[proto.Handle]*cqObj{}, qps: map[proto.Handle]*qpObj{},
		srqs: map[proto.Handle]*srqObj{}, ahs: map[proto.Handle]*ahObj{}, spaces: map[proto.Handle]*addrSpaceObj{}, maps: map[fileKey][]*memfdMap{},
		events: eventSink{fd: -1}}
	ss.log = s.log.With("client", ss.id, "pid", cr.Pid, "uid", cr.Uid)
	s.sessions[ss] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go ss.serve()
}

func (ss *session) serve() {
	s := ss.s
	defer s.wg.Done()
	// A peer that connects and never opens holds an fd for nothing.
	// (A deadline on an open socket cannot fail.)
	_ = ss.conn.UnixConn().SetReadDeadline(time.Now().Add(s.opt.OpenTimeout))
	for {
		h, body, fds, err := ss.conn.Recv()
		if err != nil {
			var ne net.Error
			switch {
			case !ss.opened && errors.As(err, &ne) && ne.Timeout():
				s.ShedConns.Add(1)
				if s.firstIn("silent", ss.cred.Uid) {
					ss.log.Warn("client closed: no OPEN (logged once a minute per uid)", "within", s.opt.OpenTimeout)
				}
			case !proto.IsClosed(err):
				ss.log.Warn("control connection dropped", "err", err)
			}
			break
		}
		opened := ss.opened
		resp, out, err := ss.handle(h, body, fds)
		if ss.opened && !opened {
			_ = ss.conn.UnixConn().SetReadDeadline(time.Time{})
			ss.log.Info("client connected")
		}
		if errors.Is(err, errDeferred) {
			continue // its goroutine replies
		}
		rerr := ss.reply(h, resp, out, err)
		for _, r := range ss.sent {
			if err := r.CloseFD(); err != nil {
				ss.log.Warn("closing a ring's memfd", "err", err)
			}
		}
		ss.sent = ss.sent[:0]
		for _, fd := range ss.afterReply {
			unix.Close(fd)
		}
		ss.afterReply = ss.afterReply[:0]
		if rerr != nil {
			break
		}
	}
	ss.closeUCM()
	ss.mu.Lock()
	capt := ss.capture
	ss.mu.Unlock()
	if capt != nil {
		// Stop flushes the file before the connection's fd is closed; the
		// capture's goroutine logs and reports how it ended.
		_, _ = capt.Stop()
	}
	queues := ss.acct.held(QueueBytes)
	info := ss.cleanup()
	ss.events.close()
	if ss.db != nil {
		s.unwatch(ss.db)
		ss.db.Close()
	}
	ss.conn.Close()
	ss.acct.leave()
	s.mu.Lock()
	delete(s.sessions, ss)
	s.mu.Unlock()
	s.returnMemory(queues)
	if ss.opened {
		ss.log.Info("client gone; resources released", "qps", info.QPs, "cqs", info.CQs, "mrs", info.MRs, "pds", info.PDs, "ahs", info.AHs)
	}
	if s.opt.OnClientGone != nil {
		s.opt.OnClientGone(info)
	}
}

func (ss *session) reply(h proto.Header, body any, fds []int, err error) error {
	if err != nil {
		no, msg := errnoOf(err)
		if len(msg) > 512 {
			msg = msg[:512]
		}
		return ss.conn.Send(proto.Header{Op: h.Op, Seq: h.Seq, Errno: uint32(no)}, []byte(msg))
	}
	return ss.conn.Send(proto.Header{Op: h.Op, Seq: h.Seq}, body, fds...)
}

// handle runs one operation. It owns fds: every received fd is either taken
// over or closed. Returned fds stay owned by the objects they belong to (the
// peer receives its own copies).
func (ss *session) handle(h proto.Header, body []byte, fds []int) (resp any, out []int, err error) {
	var wantFDs int
	switch h.Op {
	case proto.OpRegMR, proto.OpCapture:
		wantFDs = 1
	case proto.OpAttachMem:
		wantFDs = 2
	default:
		wantFDs = 0 // the other operations pass none
	}
	if len(fds) != wantFDs {
		proto.CloseFDs(fds)
		return nil, nil, errf(unix.EINVAL, "%v takes %d fds, got %d", h.Op, wantFDs, len(fds))
	}
	if h.Op != proto.OpOpen && !ss.opened {
		proto.CloseFDs(fds)
		return nil, nil, errf(unix.EPROTO, "OPEN must come first")
	}
	if h.Op >= proto.OpUCMCreateChannel && h.Op < proto.OpUCMEvent {
		return ss.ucmOp(h, body)
	}
	switch h.Op {
	case proto.OpOpen:
		var req proto.OpenReq
		if err := proto.DecodeBody(body, &req); err != nil {
			return nil, nil, err
		}
		if req.Version != proto.Version {
			return nil, nil, errf(unix.EPROTONOSUPPORT, "protocol version %d, daemon speaks %d", req.Version, proto.Version)
		}
		if ss.db == nil {
			if err := ss.take(charge{FDs, openFDs}); err != nil {
				return nil, nil, err
			}
			db, err := shmring.NewDoorbell()
			if err != nil {
				ss.give(charge{FDs, openFDs})
				return nil, nil, err
			}
			if err := ss.s.watch(db); err != nil {
				ss.give(charge{FDs, openFDs})
				db.Close()
				return nil, nil, err
			}
			ss.db = db
		}
		ss.opened = true
		return &ss.s.info, []int{ss.db.FD()}, nil
	case proto.OpAllocPD:
		return ss.allocPD(body)
	case proto.OpDeallocPD:
		return ss.deallocPD(body)
	case proto.OpRegMR:
		return ss.regMR(body, fds[0])
	case proto.OpDeregMR:
		return ss.deregMR(body)
	case proto.OpCreateCQ:
		return ss.createCQ(body)
	case proto.OpDestroyCQ:
		return ss.destroyCQ(body)
	case proto.OpCreateQP:
		return ss.createQP(body)
	case proto.OpModifyQP:
		return ss.modifyQP(body)
	case proto.OpQueryQP:
		return ss.queryQP(body)
	case proto.OpDestroyQP:
		return ss.destroyQP(body)
	case proto.OpCapture:
		return ss.startCapture(h, body, fds[0])
	case proto.OpStatus:
		return ss.status(body)
	case proto.OpStats:
		return ss.stats(body)
	case proto.OpCreateAH:
		return ss.createAH(body)
	case proto.OpDestroyAH:
		return ss.destroyAH(body)
	case proto.OpCreateSRQ:
		return ss.createSRQ(body)
	case proto.OpModifySRQ:
		return ss.modifySRQ(body)
	case proto.OpQuerySRQ:
		return ss.querySRQ(body)
	case proto.OpDestroySRQ:
		return ss.destroySRQ(body)
	case proto.OpAsyncEvents:
		return ss.asyncEvents(body)
	case proto.OpQueryDevice:
		return ss.queryDevice(body)
	case proto.OpAttachMem:
		return ss.attachMem(body, fds)
	case proto.OpRegMRAddr:
		return ss.regMRAddr(body)
	default:
		return nil, nil, errf(unix.EOPNOTSUPP, "unknown operation %v", h.Op)
	}
}

// undo logs the failure of a step that undoes a half-made object after an
// error: the client hears the first error, the log this one.
func (ss *session) undo(op string, err error) {
	if err != nil {
		ss.log.Warn("undoing "+op, "err", err)
	}
}

// newHandle names a new object of the session. An object limited by its
// own kind (QP, CQ, MR) has been charged already; the others (obj: PDs,
// SRQs, AHs, address spaces, rdma_cm event channels, IDs and listeners)
// are bounded together, per connection. Caller holds ss.mu.
func (ss *session) newHandle(obj bool) (proto.Handle, error) {
	if obj {
		n := int64(len(ss.pds) + len(ss.srqs) + len(ss.ahs) + len(ss.spaces) + ss.ucmObjects)
		if lim := ss.s.opt.Limits[Objects][PerConn]; lim >= 0 && n >= lim {
			return 0, ss.refused(ss.s.acct.refuse(ss.acct, Objects, PerConn, n, 1, lim))
		}
	}
	ss.next++
	return ss.next, nil
}

// take charges the client for what it is about to hold; over a limit, it
// fails with the limit's errno, counted and, the first time for this
// client and limit, logged.
func (ss *session) take(cs ...charge) error {
	if err := ss.acct.take(cs...); err != nil {
		return ss.refused(err)
	}
	return nil
}

// give returns what take charged.
func (ss *session) give(cs ...charge) { ss.acct.give(cs...) }

func (ss *session) refused(err *limitError) error {
	if err.first {
		ss.log.Warn("request over a limit refused", "limit", err.r.String()+"-per-"+err.s.String(), "value", err.limit, "in_use", err.used, "asked", err.want)
	}
	return err
}

func decodeHandle(body []byte) (proto.Handle, error) {
	var m proto.HandleMsg
	err := proto.DecodeBody(body, &m)
	return m.Handle, err
}

func (ss *session) allocPD(body []byte) (any, []int, error) {
	if len(body) != 0 {
		return nil, nil, errf(unix.EINVAL, "ALLOC_PD takes no body")
	}
	vpd, err := ss.s.dev.AllocPD()
	if err != nil {
		return nil, nil, err
	}
	pd := vpd.(*rnic.PD)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	h, err := ss.newHandle(true)
	if err != nil {
		ss.undo("ALLOC_PD", pd.Dealloc())
		return nil, nil, err
	}
	ss.pds[h] = &pdObj{pd: pd}
	return &proto.HandleMsg{Handle: h}, nil, nil
}

func (ss *session) deallocPD(body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	p, ok := ss.pds[h]
	if !ok {
		return nil, nil, errf(unix.ENOENT, "no PD %d on this connection", h)
	}
	if p.refs > 0 {
		return nil, nil, errf(unix.EBUSY, "PD %d still has %d MRs, QPs or AHs", h, p.refs)
	}
	delete(ss.pds, h)
	return nil, nil, p.pd.Dealloc()
}

// createAH makes an address handle in one of the session's PDs; the
// device resolves the next hop (which may block on ARP: a control
// operation, never the engine).
func (ss *session) createAH(body []byte) (any, []int, error) {
	var req proto.CreateAHReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	ss.mu.Lock()
	p, ok := ss.pds[req.PD]
	if ok {
		p.refs++ // held across the resolution, which runs unlocked
	}
	ss.mu.Unlock()
	if !ok {
		return nil, nil, errf(unix.ENOENT, "no PD %d on this connection", req.PD)
	}
	req.AV.DMAC = [6]byte{}
	req.AV.UDPSrcPort = 0
	vah, err := p.pd.CreateAH(&req.AV)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if err != nil {
		p.refs--
		return nil, nil, err
	}
	h, err := ss.newHandle(true)
	if err != nil {
		p.refs--
		ss.undo("CREATE_AH", vah.Destroy())
		return nil, nil, err
	}
	ss.ahMu.Lock()
	ss.ahs[h] = &ahObj{ah: vah.(*rnic.AH), pd: p}
	ss.ahMu.Unlock()
	return &proto.HandleMsg{Handle: h}, nil, nil
}

func (ss *session) destroyAH(body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.ahMu.Lock()
	a, ok := ss.ahs[h]
	delete(ss.ahs, h)
	ss.ahMu.Unlock()
	if !ok {
		return nil, nil, errf(unix.ENOENT, "no AH %d on this connection", h)
	}
	a.pd.refs--
	return nil, nil, a.ah.Destroy()
}

// lookupAH is the engine's view of the session's AHs: a UD WR names one
// by handle, and only the session's own resolve.
func (ss *session) lookupAH(h proto.Handle) *rnic.AH {
	ss.ahMu.Lock()
	a := ss.ahs[h]
	ss.ahMu.Unlock()
	if a == nil {
		return nil
	}
	return a.ah
}

func (ss *session) regMR(body []byte, fd int) (any, []int, error) {
	defer unix.Close(fd) // the mapping keeps the memory alive
	var req proto.RegMRReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	if req.Offset > 1<<50 {
		return nil, nil, errf(unix.EINVAL, "MR offset %d out of range", req.Offset)
	}
	if err := ss.checkMRReq(req.Access, req.Length, req.IOVA); err != nil {
		return nil, nil, err
	}
	if err := shmring.CheckSealed(fd, int64(req.Offset+req.Length)); err != nil {
		return nil, nil, errf(unix.EINVAL, "MR memory: %v", err)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	p, ok := ss.pds[req.PD]
	if !ok {
		return nil, nil, errf(unix.ENOENT, "no PD %d on this connection", req.PD)
	}
	if err := ss.take(charge{MRs, 1}); err != nil {
		return nil, nil, err
	}
	mapping, mem, err := ss.mapMemfd(fd, req.Offset, req.Length)
	if err != nil {
		ss.give(charge{MRs, 1})
		return nil, nil, err
	}
	mapping.refs++
	mr, err := p.pd.RegBytes(mem, req.IOVA, req.Access)
	if err != nil {
		ss.give(charge{MRs, 1})
		ss.unrefMap(mapping)
		ss.buryGraves()
		return nil, nil, err
	}
	h, _ := ss.newHandle(false)
	p.refs++
	ss.mrs[h] = &mrObj{mr: mr, pd: p, mem: mapping}
	return &proto.RegMRResp{MR: h, LKey: mr.LKey(), RKey: mr.RKey()}, nil, nil
}

func (ss *session) deregMR(body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	m, ok := ss.mrs[h]
	if !ok {
		return nil, nil, errf(unix.ENOENT, "no MR %d on this connection", h)
	}
	delete(ss.mrs, h)
	err = ss.releaseMR(m)
	ss.buryGraves() // at once if no QP could hold a reference into it
	return nil, nil, err
}

// releaseMR deregisters an MR: its keys stop working at once. The last
// MR of a mapping detaches the daemon from the client's memory at once:
// the mapping is replaced in place by private anonymous memory, so no
// later access (a WQE of this session posted before the deregistration, a
// responder that resolved the rkey an instant before) reaches the
// client's pages or faults. The detached range is unmapped later, when the
// session has no QP left that could still point into it (mappings.go).
// Caller holds ss.mu.
func (ss *session) releaseMR(m *mrObj) error {
	err := m.mr.Dereg()
	m.pd.refs--
	ss.give(charge{MRs, 1})
	if m.space != nil {
		// Dereg waited for the copies in progress: nothing is left to bury.
		ss.give(charge{MRBytes, m.length})
		m.space.refs--
		return err
	}
	ss.unrefMap(m.mem)
	return err
}

func pow2(n uint32) uint32 {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len32(n-1)
}

func (ss *session) createCQ(body []byte) (any, []int, error) {
	var req proto.CreateCQReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	info := &ss.s.info
	if req.Depth == 0 || req.Depth > info.MaxCQE {
		return nil, nil, errf(unix.EINVAL, "CQ depth %d not in 1..%d", req.Depth, info.MaxCQE)
	}
	slots := pow2(req.Depth)
	held := []charge{{CQs, 1}, {FDs, cqFDs}, {Mappings, cqMappings}, {QueueBytes, cqQueueBytes(slots)}}
	if err := ss.take(held...); err != nil {
		return nil, nil, err
	}
	made := false
	defer func() {
		if !made {
			ss.give(held...)
		}
	}()
	ring, err := shmring.Create("softrnic-cq", shmring.Geometry{SlotSize: proto.CQESize, Slots: int(slots)})
	if err != nil {
		return nil, nil, err
	}
	db, err := shmring.NewDoorbell()
	if err != nil {
		ring.Close()
		return nil, nil, err
	}
	c := &cqObj{owner: ss, ring: ring, db: db, held: held,
		sink: cqSink{prod: ring.Producer(db), rang: &ss.s.CQDoorbells}}
	cq, err := ss.s.dev.CreateCQSink(int(req.Depth), &c.sink)
	if err != nil {
		ring.Close()
		db.Close()
		return nil, nil, err
	}
	c.cq = cq
	ss.mu.Lock()
	h, err := ss.newHandle(false)
	if err == nil {
		c.h = h
		ss.cqs[h] = c
	}
	ss.mu.Unlock()
	if err != nil {
		ss.undo("CREATE_CQ", cq.Destroy())
		ring.Close()
		db.Close()
		return nil, nil, err
	}
	ss.s.indexCQ(c)
	made = true
	ss.sent = append(ss.sent, ring)
	return &proto.CreateCQResp{CQ: h, Slots: slots}, []int{ring.FD(), db.FD()}, nil
}

func (ss *session) destroyCQ(body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	ss.mu.Lock()
	c, ok := ss.cqs[h]
	if ok && c.refs > 0 {
		ss.mu.Unlock()
		return nil, nil, errf(unix.EBUSY, "CQ %d is used by %d QPs", h, c.refs)
	}
	delete(ss.cqs, h)
	ss.mu.Unlock()
	if !ok {
		return nil, nil, errf(unix.ENOENT, "no CQ %d on this connection", h)
	}
	return nil, nil, ss.releaseCQ(c)
}

// releaseCQ destroys the device CQ, which detaches the ring from it, and
// only then unmaps the ring.
func (ss *session) releaseCQ(c *cqObj) error {
	err := c.cq.Destroy()
	ss.s.unindexCQ(c)
	c.ring.Close()
	c.db.Close()
	ss.give(c.held...)
	return err
}

func (ss *session) createQP(body []byte) (any, []int, error) {
	var req proto.CreateQPReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	if req.Type != ib.RC && req.Type != ib.UC && req.Type != ib.UD {
		return nil, nil, errf(unix.EINVAL, "QP type %d not supported (RC %d, UC %d, UD %d)", req.Type, ib.RC, ib.UC, ib.UD)
	}
	if req.SigAll > 1 {
		return nil, nil, errf(unix.EINVAL, "sq_sig_all %d is not 0 or 1", req.SigAll)
	}
	if !req.Recovery.Valid() {
		return nil, nil, errf(unix.EINVAL, "recovery mode %d (0 default, 1 selective, 2 adaptive, 3 timeout)", req.Recovery)
	}
	if req.SRQ != 0 {
		// Receives come from the SRQ: the RQ ring is a one-slot stub.
		req.Caps.MaxRecvWR, req.Caps.MaxRecvSGE = 1, 1
	}
	c, err := ss.normCaps(req.Caps)
	if err != nil {
		return nil, nil, err
	}
	sqSlots, rqSlots := c.MaxSendWR, c.MaxRecvWR
	held := []charge{{QPs, 1}, {FDs, qpFDs}, {Mappings, qpMappings}, {QueueBytes, qpQueueBytes(c)}}
	if err := ss.take(held...); err != nil {
		return nil, nil, err
	}
	made := false
	defer func() {
		if !made {
			ss.give(held...)
		}
	}()

	ss.mu.Lock()
	p, okp := ss.pds[req.PD]
	scq, oks := ss.cqs[req.SendCQ]
	rcq, okr := ss.cqs[req.RecvCQ]
	x, okx := ss.srqs[req.SRQ]
	if req.SRQ == 0 {
		x, okx = nil, true
	}
	ss.mu.Unlock()
	switch {
	case !okp:
		return nil, nil, errf(unix.ENOENT, "no PD %d on this connection", req.PD)
	case !oks:
		return nil, nil, errf(unix.ENOENT, "no CQ %d on this connection", req.SendCQ)
	case !okr:
		return nil, nil, errf(unix.ENOENT, "no CQ %d on this connection", req.RecvCQ)
	case !okx:
		return nil, nil, errf(unix.ENOENT, "no SRQ %d on this connection", req.SRQ)
	case x != nil && x.pd != p:
		return nil, nil, errf(unix.EINVAL, "SRQ %d is of another PD than the QP", req.SRQ)
	}
	sq, err := shmring.Create("softrnic-sq", shmring.Geometry{SlotSize: proto.SendSlotSize(c), Slots: int(sqSlots)})
	if err != nil {
		return nil, nil, err
	}
	rq, err := shmring.Create("softrnic-rq", shmring.Geometry{SlotSize: proto.RecvSlotSize(c), Slots: int(rqSlots)})
	if err != nil {
		sq.Close()
		return nil, nil, err
	}
	init := &verbs.QPInitAttr{Type: req.Type, SendCQ: scq.cq, RecvCQ: rcq.cq, Cap: c, SigAll: req.SigAll != 0, Recovery: req.Recovery}
	if x != nil {
		init.SRQ = x.srq
	}
	vqp, err := p.pd.CreateQP(init)
	if err != nil {
		sq.Close()
		rq.Close()
		return nil, nil, err
	}
	qp := vqp.(*rnic.QP)
	q := &qpObj{owner: ss, qp: qp, typ: req.Type, pd: p, send: scq, recv: rcq, sq: sq, rq: rq,
		sqc: sq.Consumer(), rqc: rq.Consumer(), held: held, srq: x}
	sg := make([]ib.SGE, fetchBatch*int(c.MaxSendSGE+c.MaxRecvSGE))
	for i := range fetchBatch {
		q.swr[i].SG, sg = sg[:0:c.MaxSendSGE], sg[c.MaxSendSGE:]
		q.rwr[i].SG, sg = sg[:0:c.MaxRecvSGE], sg[c.MaxRecvSGE:]
	}
	qp.SetRecvRefill(q.refillRQ)
	ss.mu.Lock()
	h, err := ss.newHandle(false)
	if err == nil {
		q.h = h
		ss.qps[h] = q
		ss.liveQPs++
		p.refs++
		scq.refs++
		rcq.refs++
		if x != nil {
			x.refs++
		}
	}
	ss.mu.Unlock()
	if err != nil {
		ss.undo("CREATE_QP", qp.Destroy())
		sq.Close()
		rq.Close()
		return nil, nil, err
	}
	ss.s.indexQP(q)
	ss.s.ringsMu.Lock()
	ss.s.qpList = append(ss.s.qpList, q)
	ss.s.ringsMu.Unlock()
	made = true
	ss.sent = append(ss.sent, sq, rq)
	// An engine asleep armed the rings it had, not these: woken, it arms
	// them too before it sleeps again, so that the first post rings it.
	ss.s.dev.Wake()
	return &proto.CreateQPResp{QP: h, QPN: qp.QPN(), SQSlots: sqSlots, RQSlots: rqSlots, Caps: c}, []int{sq.FD(), rq.FD()}, nil
}

// normCaps checks a QP's caps against the device's and rounds them to what
// the rings hold: power-of-two queue depths, at least one SGE, and inline
// data as large as a send slot allows.
func (ss *session) normCaps(c ib.QPCaps) (ib.QPCaps, error) {
	info := &ss.s.info
	if c.MaxSendWR == 0 || c.MaxSendWR > info.MaxQPWR || c.MaxRecvWR > info.MaxQPWR ||
		c.MaxSendSGE > info.MaxSGE || c.MaxRecvSGE > info.MaxSGE || c.MaxInline > info.MaxInline {
		return c, errf(unix.EINVAL, "QP caps %+v exceed the device's (WR %d, SGE %d, inline %d)", c, info.MaxQPWR, info.MaxSGE, info.MaxInline)
	}
	if c.MaxSendSGE == 0 {
		c.MaxSendSGE = 1
	}
	if c.MaxRecvSGE == 0 {
		c.MaxRecvSGE = 1
	}
	if c.MaxRecvWR == 0 {
		c.MaxRecvWR = 1
	}
	c.MaxSendWR, c.MaxRecvWR = pow2(c.MaxSendWR), pow2(c.MaxRecvWR)
	// Whatever fits the slot is usable inline, up to what the device takes.
	c.MaxInline = min(uint32(proto.SendSlotSize(c))-64, info.MaxInline)
	return c, nil
}

func (ss *session) lookupQP(h proto.Handle) (*qpObj, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	q, ok := ss.qps[h]
	if !ok {
		return nil, errf(unix.ENOENT, "no QP %d on this connection", h)
	}
	return q, nil
}

// controlledQKey is the bit of a controlled Q_Key (IBA 10.2.4): such keys
// (QP1's 0x80010000 among them) are for privileged consumers only, so
// that an application cannot impersonate a management agent.
const controlledQKey = 0x80000000

func (ss *session) modifyQP(body []byte) (any, []int, error) {
	var req proto.ModifyQPReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	q, err := ss.lookupQP(req.QP)
	if err != nil {
		return nil, nil, err
	}
	// The device resolves the next hop of a connected QP's address vector
	// itself (its neighbour table), as the kernel does for RoCE: a client
	// cannot point its frames at a MAC of its choosing.
	req.Attr.AV.DMAC = [6]byte{}
	if req.Mask&ib.AttrQKey != 0 && req.Attr.QKey&controlledQKey != 0 && !ss.netRaw {
		ss.s.QKeyRefused.Add(1)
		return nil, nil, errf(unix.EPERM, "Q_Key %#x is a controlled Q_Key (high bit set): it needs CAP_NET_RAW", req.Attr.QKey)
	}
	return nil, nil, q.qp.Modify(&req.Attr, req.Mask)
}

func (ss *session) queryQP(body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	q, err := ss.lookupQP(h)
	if err != nil {
		return nil, nil, err
	}
	attr, err := q.qp.Query()
	if err != nil {
		return nil, nil, err
	}
	return &attr, nil, nil
}

func (ss *session) destroyQP(body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	ss.mu.Lock()
	q, ok := ss.qps[h]
	delete(ss.qps, h)
	ss.mu.Unlock()
	if !ok {
		return nil, nil, errf(unix.ENOENT, "no QP %d on this connection", h)
	}
	return nil, nil, ss.releaseQP(q)
}

func (ss *session) releaseQP(q *qpObj) error {
	s := ss.s
	s.unindexQP(q)
	s.ringsMu.Lock()
	for i, x := range s.qpList {
		if x == q {
			s.qpList = slices.Delete(s.qpList, i, i+1) // clears the tail: the QP is not kept alive
			break
		}
	}
	s.ringsMu.Unlock()
	// To the error state first: the transition takes the QP's lock, so it
	// waits for a batch the engine is delivering into the QP's MRs, and
	// every packet after it is dropped by state. Destroy alone does
	// neither, and the MRs' mappings are unmapped (buryGraves) once no QP
	// is left: a peer's UC WRITE still arriving for a client that had
	// finished faulted the daemon there.
	toErr := ib.QPAttr{State: ib.Err}
	if err := q.qp.Modify(&toErr, ib.AttrState); err != nil {
		ss.log.Warn("moving QP to error", "qpn", q.qp.QPN(), "err", err)
	}
	err := q.qp.Destroy()
	q.sq.Close()
	q.rq.Close()
	ss.give(q.held...)
	ss.mu.Lock()
	q.pd.refs--
	q.send.refs--
	q.recv.refs--
	if q.srq != nil {
		q.srq.refs--
	}
	ss.liveQPs--
	ss.buryGraves()
	ss.mu.Unlock()
	return err
}

// errorAllQPs moves every QP of the session to the error state (shutdown:
// outstanding work completes with flush errors the client can see).
func (ss *session) errorAllQPs() {
	ss.mu.Lock()
	qps := make([]*qpObj, 0, len(ss.qps))
	for _, q := range ss.qps {
		qps = append(qps, q)
	}
	ss.mu.Unlock()
	for _, q := range qps {
		attr := ib.QPAttr{State: ib.Err}
		if err := q.qp.Modify(&attr, ib.AttrState); err != nil {
			ss.log.Warn("moving QP to error", "qpn", q.qp.QPN(), "err", err)
		}
	}
}

// cleanup releases everything the client created, in dependency order:
// QPs to error and destroyed (so no more remote access through them), MRs
// deregistered and unmapped, CQs, PDs.
func (ss *session) cleanup() ClientInfo {
	ss.errorAllQPs()
	ss.mu.Lock()
	info := ClientInfo{ID: ss.id, PID: ss.cred.Pid, UID: ss.cred.Uid, GID: ss.cred.Gid,
		QPs: len(ss.qps), CQs: len(ss.cqs), MRs: len(ss.mrs), PDs: len(ss.pds), AHs: len(ss.ahs)}
	qps, srqs, mrs, cqs, pds := ss.qps, ss.srqs, ss.mrs, ss.cqs, ss.pds
	ss.qps, ss.srqs, ss.mrs, ss.cqs, ss.pds = map[proto.Handle]*qpObj{}, map[proto.Handle]*srqObj{}, map[proto.Handle]*mrObj{}, map[proto.Handle]*cqObj{}, map[proto.Handle]*pdObj{}
	ss.ahMu.Lock()
	ahs := ss.ahs
	ss.ahs = map[proto.Handle]*ahObj{}
	ss.ahMu.Unlock()
	ss.mu.Unlock()
	for _, a := range ahs {
		if err := a.ah.Destroy(); err != nil {
			ss.log.Warn("destroying AH", "err", err)
		}
	}
	for _, q := range qps {
		if err := ss.releaseQP(q); err != nil {
			ss.log.Warn("destroying QP", "qpn", q.qp.QPN(), "err", err)
		}
	}
	for _, x := range srqs {
		if err := ss.releaseSRQ(x); err != nil {
			ss.log.Warn("destroying SRQ", "err", err)
		}
	}
	ss.mu.Lock()
	for _, m := range mrs {
		if err := ss.releaseMR(m); err != nil {
			ss.log.Warn("deregistering MR", "err", err)
		}
	}
	ss.buryGraves()
	spaces := ss.spaces
	ss.spaces = map[proto.Handle]*addrSpaceObj{}
	for _, a := range spaces {
		a.release()
		ss.give(charge{FDs, addrSpaceFDs})
	}
	ss.mu.Unlock()
	for _, c := range cqs {
		if err := ss.releaseCQ(c); err != nil {
			ss.log.Warn("destroying CQ", "err", err)
		}
	}
	for _, p := range pds {
		if err := p.pd.Dealloc(); err != nil {
			ss.log.Warn("deallocating PD", "err", err)
		}
	}
	return info
}

// startCapture starts a capture into the client's file. The first reply
// says it runs; a second OpCapture message with the same Seq reports the
// result when it ends (Count reached). Closing the connection stops it.
func (ss *session) startCapture(h proto.Header, body []byte, fd int) (any, []int, error) {
	var req proto.CaptureReq
	if err := proto.DecodeBody(body, &req); err != nil {
		unix.Close(fd)
		return nil, nil, err
	}
	if ss.cred.Uid != 0 {
		unix.Close(fd)
		return nil, nil, errf(unix.EPERM, "only root may capture: a capture sees every client's traffic")
	}
	tap := ss.s.opt.Tap
	if tap == nil {
		unix.Close(fd)
		return nil, nil, errf(unix.EOPNOTSUPP, "this daemon has no capture tap")
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil || fl&unix.O_ACCMODE == unix.O_RDONLY {
		unix.Close(fd)
		return nil, nil, errf(unix.EBADF, "capture file is not open for writing")
	}
	f := os.NewFile(uintptr(fd), "capture")
	opt := capture.Options{Count: int(req.Count), QPN: req.QPN, FilterQP: req.FilterQP != 0}
	if req.PCAPNG != 0 {
		opt.Format = capture.PCAPNG
	}
	sess, err := tap.Start(f, opt)
	if errors.Is(err, capture.ErrBusy) {
		ss.undo("CAPTURE", f.Close())
		return nil, nil, errf(unix.EBUSY, "a capture is already running")
	}
	if err != nil {
		ss.undo("CAPTURE", f.Close())
		return nil, nil, err
	}
	ss.mu.Lock()
	ss.capture = sess
	ss.mu.Unlock()
	ss.log.Info("capture started", "count", req.Count, "qpn", req.QPN, "filter_qp", req.FilterQP != 0)
	go func() {
		<-sess.Done()
		st, werr := sess.Stats(), sess.Err()
		if cerr := f.Close(); werr == nil {
			werr = cerr // the file's last writes can fail at close
		}
		ss.mu.Lock()
		if ss.capture == sess {
			ss.capture = nil
		}
		ss.mu.Unlock()
		ss.log.Info("capture ended", "written", st.Written, "dropped", st.Dropped, "err", werr)
		var serr error
		if werr != nil {
			serr = ss.conn.Send(proto.Header{Op: proto.OpCapture, Seq: h.Seq, Errno: uint32(unix.EIO)}, []byte(werr.Error()))
		} else {
			serr = ss.conn.Send(proto.Header{Op: proto.OpCapture, Seq: h.Seq}, &proto.CaptureResult{Written: st.Written, Dropped: st.Dropped})
		}
		if serr != nil && !proto.IsClosed(serr) {
			ss.log.Warn("capture result not sent", "err", serr)
		}
	}()
	return nil, nil, nil
}

// status reports the port and the clients: all of them to root, only the
// caller itself to others.
func (ss *session) status(body []byte) (any, []int, error) {
	if len(body) != 0 {
		return nil, nil, errf(unix.EINVAL, "STATUS takes no body")
	}
	var r proto.StatusResp
	if f := ss.s.opt.PortStatus; f != nil {
		r.Port = f()
	}
	clients := ss.s.Clients()
	r.NumClients = uint32(len(clients))
	for _, c := range clients {
		if ss.cred.Uid != 0 && c.ID != ss.id {
			continue
		}
		if int(r.Listed) == len(r.Clients) {
			break
		}
		r.Clients[r.Listed] = proto.ClientStatus{ID: c.ID, PID: c.PID, UID: c.UID, GID: c.GID,
			QPs: uint32(c.QPs), CQs: uint32(c.CQs), MRs: uint32(c.MRs), PDs: uint32(c.PDs)}
		r.Listed++
	}
	return &r, nil, nil
}
