package daemon

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rdmacm"
)

// rdma_cm for clients (proto/ucm.go): the daemon runs the CM exchange on
// its GSI QP through the agent's event interface (rdmacm.EventCM) and
// reports what the peer did as events on the client's event channels; the
// client drives its own QPs. No operation waits for the peer.
//
// One lock (ucm.mu) guards every client's IDs and channels. The agent
// hands its events to a sink under its own lock; the sink only queues
// them, and the service's goroutine handles them under ucm.mu, so that
// operations may call the agent with ucm.mu held (ucm.mu, then the
// agent's lock, then a session's mu).

// errDeferred is returned by an operation that sent its reply itself:
// serve sends nothing.
var errDeferred = errors.New("reply deferred")

// ucmService is the daemon's rdma_cm service.
type ucmService struct {
	s  *Server
	ev *rdmacm.EventCM

	inMu    sync.Mutex
	inbox   []cm.Event // the agent's events, for the service's goroutine
	stopped bool       // the goroutine is gone: nothing more is queued
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}

	mu        sync.Mutex
	listeners map[ucmPort][]*ucmID
	byConn    map[cm.ConnID]*ucmID
	closed    bool
	stats     UCMStats
}

// ucmPort is a port of a port space.
type ucmPort struct {
	space uint16
	port  uint16
}

// UCMStats counts what the rdma_cm service did for its clients.
type UCMStats struct {
	NoListener  uint64 // requests for a port no client listens on with a matching address (REJ 8, SIDR unsupported)
	BacklogFull uint64 // requests refused because the listener's backlog was full
	Refused     uint64 // requests refused for want of room in the client (its object limit)
	Unreachable uint64 // connections reported UNREACHABLE (no answer, peer not resolved)
	Torn        uint64 // connections and requests of clients that went away, aborted (REJ or DREQ to the peer)
	EventsLost  uint64 // events dropped because a client did not read its channel
}

// ucmMaxQueue bounds the events a channel holds for a client that does
// not read them (beyond the socket's buffer).
const ucmMaxQueue = 8192

type ucmRole uint8

const (
	ucmListener ucmRole = iota + 1
	ucmActive
	ucmPassive
)

// ucmID is a client's rdma_cm ID: a listener, or one connection (or SIDR
// lookup) of either side.
type ucmID struct {
	h     proto.Handle
	ss    *session
	ch    *ucmChannel
	role  ucmRole
	space uint16

	// listener
	port    uint16
	addr    netip.Addr // invalid: any of the device's
	ipv6    bool
	afOnly  bool
	backlog int
	queued  int // requests handed out, not yet answered

	// connection
	conn      cm.ConnID // 0 until the REQ or SIDR_REQ is sent
	resolving bool      // active: the peer's address is being resolved
	listener  *ucmID    // passive, not yet answered: counts in its backlog
	local     [16]byte
	peer      [16]byte
	localPort uint16
	peerPort  uint16
	qpn       uint32 // the client's QP (TCP space)
	pathMTU   uint8
	hopLimit  uint8
	tclass    uint8
	flowLabel uint32
	retry     uint8
	// disconnected: DISCONNECTED was reported, so TIMEWAIT_EXIT is news.
	disconnected bool
}

// ucmChannel is an event channel: the daemon's end of the client's socket
// and the events not yet written to it.
type ucmChannel struct {
	h     proto.Handle
	ss    *session
	c     *net.UnixConn
	raw   syscall.RawConn
	seq   uint32
	queue [][]byte // guarded by ucm.mu
	// writing: the writer holds messages taken from queue, not yet all
	// written (guarded by ucm.mu); an event may skip the queue only when
	// neither it nor the queue holds any.
	writing bool
	flush   bool // write what is queued, then close (guarded by ucm.mu)
	kick    chan struct{}
	done    chan struct{}
}

// ucmSession is a session's part of the service (guarded by ucm.mu).
type ucmSession struct {
	channels map[proto.Handle]*ucmChannel
	ids      map[proto.Handle]*ucmID
}

// startUCM starts the service on the agent's event interface.
func (s *Server) startUCM(a *rdmacm.Agent) error {
	u := &ucmService{s: s, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		listeners: map[ucmPort][]*ucmID{}, byConn: map[cm.ConnID]*ucmID{}}
	ev, err := a.EventCM(u.sink)
	if err != nil {
		return err
	}
	u.ev = ev
	s.ucm = u
	go u.run()
	return nil
}

// sink is the agent's EventSink: it queues, under the agent's lock.
func (u *ucmService) sink(e *cm.Event) {
	u.inMu.Lock()
	if u.stopped {
		u.inMu.Unlock()
		return
	}
	u.inbox = append(u.inbox, *e)
	u.inMu.Unlock()
	select {
	case u.kick <- struct{}{}:
	default:
	}
}

// run handles the agent's events in order.
func (u *ucmService) run() {
	defer close(u.done)
	var batch []cm.Event
	for {
		select {
		case <-u.kick:
		case <-u.stop:
			return
		}
		u.inMu.Lock()
		batch, u.inbox = u.inbox, batch[:0]
		u.inMu.Unlock()
		u.mu.Lock()
		for i := range batch {
			u.handleEvent(&batch[i])
		}
		u.mu.Unlock()
	}
}

// UCMStats returns the rdma_cm service's counters (zero without one).
func (s *Server) UCMStats() UCMStats {
	u := s.ucm
	if u == nil {
		return UCMStats{}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.stats
}

// CMCounters returns the rdma_cm counters (proto.CMCounters): the agent's
// and its Manager's, and the service's for its clients; ok is false
// without an agent.
func (s *Server) CMCounters() (c [proto.NumCMCounters]uint64, ok bool) {
	if s.cm == nil {
		return c, false
	}
	a, m := s.cm.Stats()
	u := s.UCMStats()
	c[proto.CMRxMsgs] = a.RxMADs + a.RxBad
	for _, n := range m.Tx {
		c[proto.CMTxMsgs] += n
	}
	c[proto.CMTxRetries] = m.Retransmits
	c[proto.CMRxDuplicates] = m.Duplicates
	c[proto.CMRxMalformed] = a.RxBad + m.Malformed
	c[proto.CMRxUnsupported] = m.Unsupported
	c[proto.CMRxUnmatched] = m.Unmatched
	c[proto.CMReqDropped] = m.HalfOpenDropped
	c[proto.CMRejNoListener] = m.NoListener + u.NoListener
	c[proto.CMBacklogFull] = a.BacklogFull + u.BacklogFull + u.Refused
	c[proto.CMTimeouts] = m.Timeouts
	c[proto.CMTornDown] = u.Torn
	c[proto.CMUnresolved] = a.Unresolved
	c[proto.CMEventsLost] = u.EventsLost
	return c, true
}

// shutdown tells every client DEVICE_REMOVAL for each of its IDs, writes
// what its channels hold (bounded by wait), and closes them.
func (u *ucmService) shutdown(wait time.Duration) {
	u.mu.Lock()
	u.closed = true
	var chans []*ucmChannel
	u.s.mu.Lock()
	sessions := make([]*session, 0, len(u.s.sessions))
	for ss := range u.s.sessions {
		sessions = append(sessions, ss)
	}
	u.s.mu.Unlock()
	for _, ss := range sessions {
		us := ss.ucm
		if us == nil {
			continue
		}
		for _, id := range us.ids {
			u.emit(id, &proto.UCMEvent{Event: proto.UCMEventDeviceRemoval})
		}
		for _, ch := range us.channels {
			ch.flush = true
			ch.wake()
			chans = append(chans, ch)
		}
	}
	u.mu.Unlock()
	deadline := time.After(wait)
	for _, ch := range chans {
		select {
		case <-ch.done:
		case <-deadline:
		}
	}
}

// close ends the service once its clients are gone: the agent's event
// interface is released (what is left of its connections aborted) and
// the service's goroutine stops.
func (u *ucmService) close() {
	u.ev.Close()
	u.inMu.Lock()
	u.stopped, u.inbox = true, nil
	u.inMu.Unlock()
	close(u.stop)
	<-u.done
}

// ---- channels ----

func (ch *ucmChannel) wake() {
	select {
	case ch.kick <- struct{}{}:
	default:
	}
}

// writer writes the channel's events in order; it blocks only itself when
// the client does not read.
func (u *ucmService) writer(ch *ucmChannel) {
	defer close(ch.done)
	defer ch.c.Close()
	for {
		<-ch.kick
		u.mu.Lock()
		q, flush := ch.queue, ch.flush
		ch.queue, ch.writing = nil, len(q) > 0
		u.mu.Unlock()
		for _, m := range q {
			if _, err := ch.c.Write(m); err != nil {
				return // the client closed its end, or the channel was destroyed
			}
		}
		u.mu.Lock()
		ch.writing = false
		if len(ch.queue) > 0 {
			ch.wake()
		}
		u.mu.Unlock()
		if flush {
			return
		}
	}
}

// emit writes ev for id on its channel: ID, addresses and ports default to
// id's. Caller holds u.mu.
func (u *ucmService) emit(id *ucmID, ev *proto.UCMEvent) {
	ch := id.ch
	if ch == nil || ch.flush && ev.Event != proto.UCMEventDeviceRemoval {
		return
	}
	if len(ch.queue) >= ucmMaxQueue {
		u.stats.EventsLost++
		return
	}
	ev.ID = id.h
	if ev.Local == ([16]byte{}) {
		ev.Local, ev.Peer = id.local, id.peer
		ev.LocalPort, ev.PeerPort = id.localPort, id.peerPort
	}
	if ev.PKey == 0 {
		ev.PKey = 0xFFFF
	}
	ch.seq++
	msg, err := proto.Encode(make([]byte, 0, 512), proto.Header{Op: proto.OpUCMEvent, Version: proto.Version, Seq: ch.seq}, ev)
	if err != nil {
		return
	}
	if len(ch.queue) == 0 && !ch.writing && !ch.flush && ch.tryWrite(msg) {
		return // the common case: room in the socket, written here
	}
	ch.queue = append(ch.queue, msg)
	ch.wake()
}

// tryWrite writes msg if the socket has room at once, without waiting:
// it reports whether msg went (or never will: the client is gone).
func (ch *ucmChannel) tryWrite(msg []byte) bool {
	var werr error
	err := ch.raw.Write(func(fd uintptr) bool {
		_, werr = unix.Write(int(fd), msg)
		return true // never wait for room: the writer goroutine does
	})
	if err == nil {
		err = werr
	}
	return !errors.Is(err, unix.EAGAIN)
}

// ---- operations ----

// ucmOp serves one UCM operation of ss.
func (ss *session) ucmOp(h proto.Header, body []byte) (any, []int, error) {
	u := ss.s.ucm
	if u == nil {
		return nil, nil, errf(unix.ENOSYS, "this daemon runs no rdma_cm agent")
	}
	switch h.Op {
	case proto.OpUCMCreateChannel:
		return u.createChannel(ss, h, body)
	case proto.OpUCMConnect:
		// The reply goes before the REQ may leave: a client reading its
		// reply and its events in two threads should rarely see the
		// peer's answer before it knows the ID (and must cope if it
		// does). Never written under u.mu: a client that does not read
		// its control connection stalls only its own session.
		resp, start, err := u.connect(ss, body)
		if err != nil {
			return nil, nil, err
		}
		rerr := ss.reply(h, resp, nil, nil)
		start()
		if rerr != nil {
			return nil, nil, rerr
		}
		return nil, nil, errDeferred
	default: // the operations below, under u.mu
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, nil, errf(unix.ENODEV, "the daemon is stopping")
	}
	if ss.ucm == nil {
		ss.ucm = &ucmSession{channels: map[proto.Handle]*ucmChannel{}, ids: map[proto.Handle]*ucmID{}}
	}
	switch h.Op {
	case proto.OpUCMDestroyChannel:
		return u.destroyChannel(ss, body)
	case proto.OpUCMListen:
		return u.listen(ss, body)
	case proto.OpUCMAccept:
		return u.accept(ss, body)
	case proto.OpUCMReject:
		return u.reject(ss, body)
	case proto.OpUCMEstablish:
		return u.establish(ss, body)
	case proto.OpUCMNotify:
		return u.notify(ss, body)
	case proto.OpUCMDisconnect:
		return u.disconnect(ss, body)
	case proto.OpUCMMigrate:
		return u.migrate(ss, body)
	case proto.OpUCMDestroyID:
		return u.destroyIDOp(ss, body)
	default:
		return nil, nil, errf(unix.EOPNOTSUPP, "unknown operation %v", h.Op)
	}
}

// newHandle takes a handle in ss's space for a UCM object; u.mu held.
func (u *ucmService) newHandle(ss *session) (proto.Handle, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	h, err := ss.newHandle(true)
	if err == nil {
		ss.ucmObjects++
	}
	return h, err
}

func (u *ucmService) dropHandle(ss *session) {
	ss.mu.Lock()
	ss.ucmObjects--
	ss.mu.Unlock()
}

// createChannel makes a socket pair: the client gets one end with the
// reply, sent here so that the daemon's copy of that end can be closed
// after it.
func (u *ucmService) createChannel(ss *session, h proto.Header, body []byte) (any, []int, error) {
	if len(body) != 0 {
		return nil, nil, errf(unix.EINVAL, "UCM_CREATE_CHANNEL takes no body")
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	f := os.NewFile(uintptr(fds[0]), "ucm-channel")
	fc, err := net.FileConn(f)
	_ = f.Close() // FileConn holds its own descriptor
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		fc.Close()
		unix.Close(fds[1])
		return nil, nil, errf(unix.ENODEV, "the daemon is stopping")
	}
	if ss.ucm == nil {
		ss.ucm = &ucmSession{channels: map[proto.Handle]*ucmChannel{}, ids: map[proto.Handle]*ucmID{}}
	}
	ch := &ucmChannel{ss: ss, c: fc.(*net.UnixConn), kick: make(chan struct{}, 1), done: make(chan struct{})}
	if ch.raw, err = ch.c.SyscallConn(); err == nil {
		ch.h, err = u.newHandle(ss)
	}
	if err != nil {
		u.mu.Unlock()
		fc.Close()
		unix.Close(fds[1])
		return nil, nil, err
	}
	ss.ucm.channels[ch.h] = ch
	go u.writer(ch)
	u.mu.Unlock()
	err = ss.reply(h, &proto.HandleMsg{Handle: ch.h}, []int{fds[1]}, nil)
	unix.Close(fds[1])
	if err != nil {
		return nil, nil, err
	}
	return nil, nil, errDeferred
}

func (u *ucmService) destroyChannel(ss *session, body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	ch := ss.ucm.channels[h]
	if ch == nil {
		return nil, nil, errf(unix.ENOENT, "no event channel %d on this connection", h)
	}
	for _, id := range ss.ucm.ids {
		if id.ch == ch {
			u.destroyID(id, false)
		}
	}
	u.closeChannel(ss, ch)
	return nil, nil, nil
}

// closeChannel closes ch at once (what it holds is dropped); u.mu held.
func (u *ucmService) closeChannel(ss *session, ch *ucmChannel) {
	delete(ss.ucm.channels, ch.h)
	ch.queue = nil
	ch.c.Close() // a writer blocked on the client fails and ends
	ch.flush = true
	ch.wake()
	u.dropHandle(ss)
}

func (ss *session) ucmChannel(h proto.Handle) (*ucmChannel, error) {
	ch := ss.ucm.channels[h]
	if ch == nil {
		return nil, errf(unix.ENOENT, "no event channel %d on this connection", h)
	}
	return ch, nil
}

func (ss *session) ucmID(h proto.Handle) (*ucmID, error) {
	id := ss.ucm.ids[h]
	if id == nil {
		return nil, errf(unix.ENOENT, "no rdma_cm ID %d on this connection", h)
	}
	return id, nil
}

func spaceServiceID(space, port uint16) (uint64, error) {
	switch space {
	case proto.PortSpaceTCP:
		return cm.ServiceIDTCP(port), nil
	case proto.PortSpaceUDP:
		return cm.ServiceIDUDP(port), nil
	}
	return 0, errf(unix.EINVAL, "unknown rdma_cm port space %d", space)
}

// covers reports whether listener id takes requests to dst (the rdma_cm
// header's destination), as the kernel's rdma_cm matches a bound ID: by
// address (any, or its own), and by family (an IPv6 listener takes IPv4
// requests unless AFONLY).
func (id *ucmID) covers(dst netip.Addr) bool {
	if id.addr.IsValid() {
		return id.addr == dst
	}
	if dst.Is4() {
		return !id.ipv6 || !id.afOnly
	}
	return id.ipv6
}

// overlaps reports whether two listeners could take the same request.
func (id *ucmID) overlaps(o *ucmID) bool {
	switch {
	case id.addr.IsValid() && o.addr.IsValid():
		return id.addr == o.addr
	case id.addr.IsValid():
		return o.covers(id.addr)
	case o.addr.IsValid():
		return id.covers(o.addr)
	}
	// Both wildcards: they share IPv4 unless one is IPv6 only.
	if id.ipv6 && o.ipv6 {
		return true
	}
	return id.covers(netip.IPv4Unspecified()) && o.covers(netip.IPv4Unspecified())
}

func (u *ucmService) listen(ss *session, body []byte) (any, []int, error) {
	var req proto.UCMListenReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	ch, err := ss.ucmChannel(req.Channel)
	if err != nil {
		return nil, nil, err
	}
	svc, err := spaceServiceID(req.Space, req.Port)
	if err != nil {
		return nil, nil, err
	}
	if req.Backlog > 1024 {
		return nil, nil, errf(unix.EINVAL, "backlog %d over 1024", req.Backlog)
	}
	if req.IPVersion != 4 && req.IPVersion != 6 {
		return nil, nil, errf(unix.EINVAL, "IP version %d", req.IPVersion)
	}
	l := &ucmID{ss: ss, ch: ch, role: ucmListener, space: req.Space, port: req.Port, ipv6: req.IPVersion == 6,
		afOnly: req.AFOnly != 0, backlog: int(req.Backlog)}
	if l.backlog == 0 {
		l.backlog = 1024
	}
	if req.Addr != ([16]byte{}) {
		l.addr = netip.AddrFrom16(req.Addr).Unmap()
		if !u.s.hasGID(l.addr) {
			return nil, nil, errf(unix.EADDRNOTAVAIL, "%v is not one of the device's GIDs", l.addr)
		}
	}
	key := ucmPort{req.Space, req.Port}
	for _, o := range u.listeners[key] {
		if l.overlaps(o) {
			return nil, nil, errf(unix.EADDRINUSE, "rdma_cm port %d is listened on", req.Port)
		}
	}
	if len(u.listeners[key]) == 0 {
		if err := u.ev.Listen(svc); err != nil {
			if errors.Is(err, cm.ErrListening) {
				return nil, nil, errf(unix.EADDRINUSE, "rdma_cm port %d is the daemon's", req.Port)
			}
			return nil, nil, err
		}
	}
	if l.h, err = u.newHandle(ss); err != nil {
		if len(u.listeners[key]) == 0 {
			_ = u.ev.Unlisten(svc) // ours: it cannot be unknown
		}
		return nil, nil, err
	}
	u.listeners[key] = append(u.listeners[key], l)
	ss.ucm.ids[l.h] = l
	return &proto.HandleMsg{Handle: l.h}, nil, nil
}

// hasGID reports whether a is one of the device's GIDs.
func (s *Server) hasGID(a netip.Addr) bool {
	for i := range min(int(s.info.NumGIDs), len(s.info.GIDs)) {
		if netip.AddrFrom16(s.info.GIDs[i]).Unmap() == a {
			return true
		}
	}
	return false
}

// portMTU is the port's active MTU as the IB enum.
func (s *Server) portMTU() uint8 { return cm.MTUEnum(int(s.info.ActiveMTU)) }

// qpByQPN finds one of ss's QPs by number.
func (ss *session) qpByQPN(qpn uint32) *qpObj {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, q := range ss.qps {
		if q.qp.QPN() == qpn {
			return q
		}
	}
	return nil
}

func privateData(p *proto.UCMConnParam, max int) ([]byte, error) {
	n := int(p.PrivateDataLen)
	if n > max || n > len(p.PrivateData) {
		return nil, errf(unix.EINVAL, "%d bytes of private data, at most %d", n, max)
	}
	return p.PrivateData[:n], nil
}

// connect makes an active ID; start, called once the reply is sent,
// resolves the peer's MAC and sends the REQ or SIDR_REQ.
func (u *ucmService) connect(ss *session, body []byte) (*proto.HandleMsg, func(), error) {
	var req proto.UCMConnectReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, nil, errf(unix.ENODEV, "the daemon is stopping")
	}
	if ss.ucm == nil {
		return nil, nil, errf(unix.ENOENT, "no event channel %d on this connection", req.Channel)
	}
	ch, err := ss.ucmChannel(req.Channel)
	if err != nil {
		return nil, nil, err
	}
	svc, err := spaceServiceID(req.Space, req.DstPort)
	if err != nil {
		return nil, nil, err
	}
	local, peer := netip.AddrFrom16(req.Local).Unmap(), netip.AddrFrom16(req.Peer).Unmap()
	if !u.s.hasGID(local) {
		return nil, nil, errf(unix.EADDRNOTAVAIL, "%v is not one of the device's GIDs", local)
	}
	if !peer.IsValid() || peer.IsUnspecified() || peer.Is4() != local.Is4() {
		return nil, nil, errf(unix.EINVAL, "peer %v from %v", peer, local)
	}
	max := proto.UCMConnectPrivateData
	if req.Space == proto.PortSpaceUDP {
		max = proto.UCMResolvePrivateData
	}
	private, err := privateData(&req.Param, max)
	if err != nil {
		return nil, nil, err
	}
	id := &ucmID{ss: ss, ch: ch, role: ucmActive, space: req.Space, local: req.Local, peer: req.Peer,
		localPort: req.SrcPort, peerPort: req.DstPort, hopLimit: req.HopLimit, tclass: req.TrafficClass,
		flowLabel: req.FlowLabel & 0xFFFFF, retry: min(req.Param.RetryCount, 7)}
	if id.hopLimit == 0 {
		id.hopLimit = cm.DefaultHopLimit
	}
	if id.flowLabel == 0 {
		id.flowLabel = rdmacm.RoCEFlowLabel(req.SrcPort, req.DstPort)
	}
	var cp cm.ConnectParams
	if req.Space == proto.PortSpaceTCP {
		if req.QPType != ib.RC {
			return nil, nil, errf(unix.EOPNOTSUPP, "rdma_cm connects RC QPs, not %v", req.QPType)
		}
		q := ss.qpByQPN(req.Param.QPN)
		if q == nil || q.typ != ib.RC {
			return nil, nil, errf(unix.EINVAL, "QP %#x is not an RC QP of this connection", req.Param.QPN)
		}
		id.qpn = req.Param.QPN
		id.pathMTU = min(max8(req.PathMTU, 1), u.s.portMTU())
		cp = cm.ConnectParams{Peer: peer, Local: local, ServiceID: svc, QPN: id.qpn, StartingPSN: req.Param.StartingPSN & 0xFFFFFF,
			PathMTU: id.pathMTU, ResponderResources: req.Param.ResponderResources, InitiatorDepth: req.Param.InitiatorDepth,
			RetryCount: id.retry, RNRRetry: min(req.Param.RNRRetryCount, 7), HopLimit: id.hopLimit,
			TrafficClass: id.tclass, FlowLabel: id.flowLabel, SrcPort: req.SrcPort, PrivateData: append([]byte(nil), private...)}
	}
	sp := cm.SIDRParams{Peer: peer, Local: local, ServiceID: svc, SrcPort: req.SrcPort, PrivateData: append([]byte(nil), private...)}
	if id.h, err = u.newHandle(ss); err != nil {
		return nil, nil, err
	}
	ss.ucm.ids[id.h] = id
	id.resolving = true
	// The peer's MAC may take an ARP exchange: resolve it off the lock and
	// send the REQ (or SIDR_REQ) once it is known.
	start := func() {
		if u.ev.Resolved(peer) {
			u.start(ss, id, peer, &cp, &sp) // at once: no address to resolve
		} else {
			go u.start(ss, id, peer, &cp, &sp)
		}
	}
	return &proto.HandleMsg{Handle: id.h}, start, nil
}

// start resolves an active ID's peer and sends its REQ or SIDR_REQ, or
// reports it UNREACHABLE.
func (u *ucmService) start(ss *session, id *ucmID, peer netip.Addr, cp *cm.ConnectParams, sp *cm.SIDRParams) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	rerr := u.ev.ResolvePeer(ctx, peer)
	cancel()
	u.mu.Lock()
	defer u.mu.Unlock()
	if ss.ucm == nil || ss.ucm.ids[id.h] != id || !id.resolving {
		return // destroyed meanwhile
	}
	id.resolving = false
	if rerr != nil {
		u.stats.Unreachable++
		u.emit(id, &proto.UCMEvent{Event: proto.UCMEventUnreachable, Status: -int32(unix.EHOSTUNREACH)})
		return
	}
	var conn cm.ConnID
	var err error
	if id.space == proto.PortSpaceTCP {
		conn, err = u.ev.Connect(cp)
	} else {
		conn, err = u.ev.Resolve(sp)
	}
	if err != nil {
		no, _ := errnoOf(err)
		u.emit(id, &proto.UCMEvent{Event: proto.UCMEventUnreachable, Status: -int32(no)})
		return
	}
	id.conn = conn
	u.byConn[conn] = id
}

func max8(a, b uint8) uint8 {
	if a > b {
		return a
	}
	return b
}

// pending reports whether id is a passive request not yet answered.
func (id *ucmID) pending() bool { return id.role == ucmPassive && id.listener != nil }

// answered takes a passive request out of its listener's backlog.
func (id *ucmID) answered() {
	if l := id.listener; l != nil {
		l.queued--
		id.listener = nil
	}
}

func (u *ucmService) accept(ss *session, body []byte) (any, []int, error) {
	var req proto.UCMAcceptReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	id, err := ss.ucmID(req.ID)
	if err != nil {
		return nil, nil, err
	}
	if !id.pending() || id.conn == 0 {
		return nil, nil, errf(unix.EINVAL, "ID %d is not a connection request", req.ID)
	}
	q := ss.qpByQPN(req.Param.QPN)
	if id.space == proto.PortSpaceUDP {
		private, err := privateData(&req.Param, proto.UCMAcceptUDPrivateData)
		if err != nil {
			return nil, nil, err
		}
		// The answer names a QP a peer will send to: only one of this
		// client's UD QPs, ready for it (RTS) with the Q_Key the answer
		// tells the peer to use.
		if q == nil || q.typ != ib.UD {
			return nil, nil, errf(unix.EINVAL, "QP %#x is not a UD QP of this connection", req.Param.QPN)
		}
		attr, err := q.qp.Query()
		if err != nil {
			return nil, nil, err
		}
		if attr.State != ib.RTS {
			return nil, nil, errf(unix.EINVAL, "UD QP %#x is in %v, not RTS", req.Param.QPN, attr.State)
		}
		if attr.QKey != req.QKey {
			return nil, nil, errf(unix.EINVAL, "UD QP %#x has Q_Key %#x, the answer says %#x", req.Param.QPN, attr.QKey, req.QKey)
		}
		if err := u.ev.SIDRReply(id.conn, &cm.SIDRReplyParams{Status: cm.SIDRSuccess, QPN: req.Param.QPN, QKey: req.QKey,
			PrivateData: private}); err != nil {
			return nil, nil, cmErrno(err)
		}
		id.answered()
		return nil, nil, nil
	}
	private, err := privateData(&req.Param, proto.UCMAcceptPrivateData)
	if err != nil {
		return nil, nil, err
	}
	if q == nil || q.typ != ib.RC {
		return nil, nil, errf(unix.EINVAL, "QP %#x is not an RC QP of this connection", req.Param.QPN)
	}
	// The peer may send as soon as it has the REP.
	if st := q.qp.State(); st != ib.RTR && st != ib.RTS {
		return nil, nil, errf(unix.EINVAL, "QP %#x is in %v: a REP goes once it is in RTR", req.Param.QPN, st)
	}
	if err := u.ev.Accept(id.conn, &cm.AcceptParams{QPN: req.Param.QPN, StartingPSN: req.Param.StartingPSN & 0xFFFFFF,
		ResponderResources: req.Param.ResponderResources, InitiatorDepth: req.Param.InitiatorDepth,
		RNRRetry: min(req.Param.RNRRetryCount, 7), SRQ: req.Param.SRQ != 0, PrivateData: private}); err != nil {
		return nil, nil, cmErrno(err)
	}
	id.qpn = req.Param.QPN
	id.answered()
	return nil, nil, nil
}

// cmErrno turns the CM's refusals into what the kernel answers.
func cmErrno(err error) error {
	switch {
	case errors.Is(err, cm.ErrBadState), errors.Is(err, cm.ErrNoConn), errors.Is(err, rdmacm.ErrNotEventCM):
		return errf(unix.EINVAL, "the connection is not in a state for this (it may have timed out): %v", err)
	case errors.Is(err, cm.ErrPrivateTooBig), errors.Is(err, cm.ErrBadParams):
		return errf(unix.EINVAL, "%v", err)
	}
	return err
}

func (u *ucmService) reject(ss *session, body []byte) (any, []int, error) {
	var req proto.UCMRejectReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	id, err := ss.ucmID(req.ID)
	if err != nil {
		return nil, nil, err
	}
	if id.conn == 0 || id.role == ucmListener {
		return nil, nil, errf(unix.EINVAL, "ID %d has no connection to refuse", req.ID)
	}
	max := proto.UCMRejectPrivateData
	if id.space == proto.PortSpaceUDP {
		max = proto.UCMRejectUDPPrivateData
	}
	n := int(req.PrivateDataLen)
	if n > max {
		return nil, nil, errf(unix.EINVAL, "%d bytes of private data, at most %d", n, max)
	}
	private := req.PrivateData[:n]
	switch {
	case id.space == proto.PortSpaceUDP && id.pending():
		err = u.ev.SIDRReply(id.conn, &cm.SIDRReplyParams{Status: cm.SIDRReject, PrivateData: private})
	case id.space == proto.PortSpaceTCP && (id.pending() || id.role == ucmActive):
		err = u.ev.Reject(id.conn, cm.RejectReason(req.Reason), private)
	default:
		err = errf(unix.EINVAL, "ID %d has no request or reply to refuse", req.ID)
	}
	if err != nil {
		return nil, nil, cmErrno(err)
	}
	id.answered()
	return nil, nil, nil
}

func (u *ucmService) connOf(ss *session, body []byte) (*ucmID, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, err
	}
	id, err := ss.ucmID(h)
	if err != nil {
		return nil, err
	}
	if id.role == ucmListener || id.space != proto.PortSpaceTCP {
		return nil, errf(unix.EINVAL, "ID %d is not a connection", h)
	}
	return id, nil
}

func (u *ucmService) establish(ss *session, body []byte) (any, []int, error) {
	id, err := u.connOf(ss, body)
	if err != nil {
		return nil, nil, err
	}
	if id.role != ucmActive || id.conn == 0 {
		return nil, nil, errf(unix.EINVAL, "ID %d has no reply to establish", id.h)
	}
	return nil, nil, cmErrno(u.ev.Establish(id.conn))
}

func (u *ucmService) notify(ss *session, body []byte) (any, []int, error) {
	id, err := u.connOf(ss, body)
	if err != nil {
		return nil, nil, err
	}
	if id.role != ucmPassive || id.conn == 0 {
		return nil, nil, errf(unix.EINVAL, "ID %d is not an accepted request", id.h)
	}
	err = u.ev.Notify(id.conn)
	if errors.Is(err, cm.ErrBadState) {
		err = nil // established already, or over: nothing to do, as the kernel
	}
	return nil, nil, cmErrno(err)
}

// disconnect sends a DREQ for an established connection; one already
// disconnecting (the peer's DREQ came first) needs nothing, and one not
// yet established is refused (REJ), as rdma_disconnect leaves it unusable.
func (u *ucmService) disconnect(ss *session, body []byte) (any, []int, error) {
	id, err := u.connOf(ss, body)
	if err != nil {
		return nil, nil, err
	}
	if id.conn == 0 {
		if id.resolving {
			id.resolving = false // the REQ will not go
			return nil, nil, nil
		}
		return nil, nil, errf(unix.EINVAL, "ID %d is not connected", id.h)
	}
	switch u.ev.State(id.conn) {
	case cm.StateEstablished:
		err = u.ev.Disconnect(id.conn, nil)
	case cm.StateIdle, cm.StateDREQSent, cm.StateTimeWait:
	default:
		id.answered()
		err = u.ev.Abort(id.conn)
	}
	return nil, nil, cmErrno(err)
}

func (u *ucmService) migrate(ss *session, body []byte) (any, []int, error) {
	var req proto.UCMMigrateReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	id, err := ss.ucmID(req.ID)
	if err != nil {
		return nil, nil, err
	}
	ch, err := ss.ucmChannel(req.Channel)
	if err != nil {
		return nil, nil, err
	}
	id.ch = ch
	return nil, nil, nil
}

func (u *ucmService) destroyIDOp(ss *session, body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	id, err := ss.ucmID(h)
	if err != nil {
		return nil, nil, err
	}
	u.destroyID(id, false)
	return nil, nil, nil
}

// destroyID ends what id holds: a listener stops (the requests it handed
// out are their own IDs); a connection being set up is refused, an
// established one disconnected (the CM runs its course to time-wait
// without the ID). torn counts a dead client's. u.mu held.
func (u *ucmService) destroyID(id *ucmID, torn bool) {
	ss := id.ss
	delete(ss.ucm.ids, id.h)
	u.dropHandle(ss)
	id.resolving = false
	if id.role == ucmListener {
		key := ucmPort{id.space, id.port}
		ls := u.listeners[key]
		for i, l := range ls {
			if l == id {
				ls = append(ls[:i], ls[i+1:]...)
				break
			}
		}
		if len(ls) == 0 {
			delete(u.listeners, key)
			if svc, err := spaceServiceID(id.space, id.port); err == nil {
				_ = u.ev.Unlisten(svc) // ours: it cannot be unknown
			}
		} else {
			u.listeners[key] = ls
		}
		// Requests of this listener not yet answered stay counted nowhere.
		for _, o := range ss.ucm.ids {
			if o.listener == id {
				o.listener = nil
			}
		}
		return
	}
	id.answered()
	if id.conn == 0 {
		return
	}
	delete(u.byConn, id.conn)
	switch u.ev.State(id.conn) {
	case cm.StateIdle, cm.StateTimeWait, cm.StateDREQSent, cm.StateSIDRREPSent:
		return
	default: // still connecting or connected: aborted below
	}
	if torn {
		u.stats.Torn++
	}
	_ = u.ev.Abort(id.conn) // a connection already gone needs none
}

// closeSession ends a client's rdma_cm when its connection closes: every
// ID as DESTROY_ID ends it (REJ or DREQ to the peers of its connections),
// then its channels.
func (ss *session) closeUCM() {
	u := ss.s.ucm
	if u == nil {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	us := ss.ucm
	if us == nil {
		return
	}
	// Listeners first: no new request reaches the client meanwhile.
	for _, id := range us.ids {
		if id.role == ucmListener {
			u.destroyID(id, true)
		}
	}
	for _, id := range us.ids {
		u.destroyID(id, true)
	}
	for _, ch := range us.channels {
		u.closeChannel(ss, ch)
	}
	ss.ucm = nil
}

// ---- the agent's events ----

// handleEvent turns one of the agent's events into the client's; u.mu
// held.
func (u *ucmService) handleEvent(e *cm.Event) {
	if e.Kind == cm.EventConnRequest || e.Kind == cm.EventSIDRRequest {
		u.request(e)
		return
	}
	id := u.byConn[e.ID]
	if id == nil {
		return // its ID is gone: the CM finishes without it
	}
	ev := proto.UCMEvent{}
	switch e.Kind {
	case cm.EventConnResponse:
		ev.Event = proto.UCMEventConnectResponse
		ev.PathMTU, ev.ACKTimeout = id.pathMTU, e.QP.Timeout
		ev.HopLimit, ev.TrafficClass, ev.FlowLabel = id.hopLimit, id.tclass, id.flowLabel
		ev.Param = connParam(&e.QP, e.Private())
		ev.Param.RetryCount = id.retry
	case cm.EventEstablished:
		ev.Event = proto.UCMEventEstablished
		ev.Param = connParam(&e.QP, e.Private())
	case cm.EventRejected:
		ev.Event, ev.Status = proto.UCMEventRejected, int32(e.Reason)
		setPrivate(&ev.Param, e.Private())
		id.answered()
	case cm.EventTimeout, cm.EventSIDRTimeout:
		u.stats.Unreachable++
		ev.Event, ev.Status = proto.UCMEventUnreachable, -int32(unix.ETIMEDOUT)
		id.answered()
	case cm.EventDisconnectRequest, cm.EventDisconnected:
		ev.Event = proto.UCMEventDisconnected
		if e.TimedOut {
			ev.Status = -int32(unix.ETIMEDOUT)
		}
		setPrivate(&ev.Param, e.Private())
		id.disconnected = true
	case cm.EventTimeWaitExit:
		delete(u.byConn, e.ID)
		id.conn = 0
		if !id.disconnected {
			return // the kernel reports it only after DISCONNECTED
		}
		ev.Event = proto.UCMEventTimewaitExit
	case cm.EventSIDRReply:
		delete(u.byConn, e.ID)
		if e.SIDRStatus != cm.SIDRSuccess {
			u.stats.Unreachable++
			ev.Event, ev.Status = proto.UCMEventUnreachable, int32(e.SIDRStatus)
			setPrivate(&ev.Param, e.Private())
			break
		}
		ev.Event = proto.UCMEventEstablished
		ev.QKey = e.QKey
		ev.HopLimit, ev.TrafficClass, ev.FlowLabel = id.hopLimit, id.tclass, id.flowLabel
		ev.Param.QPN = e.QP.RemoteQPN
		setPrivate(&ev.Param, e.Private())
	default:
		return
	}
	u.emit(id, &ev)
}

// connParam is rdma_conn_param from our side of a connection: the peer's
// QP and first PSN, what we must accept and what we may issue.
func connParam(q *cm.QPAttr, private []byte) proto.UCMConnParam {
	p := proto.UCMConnParam{QPN: q.RemoteQPN, StartingPSN: q.SQPSN, ResponderResources: q.MaxDestRdAtomic,
		InitiatorDepth: q.MaxRdAtomic, RetryCount: q.RetryCount, RNRRetryCount: q.RNRRetry}
	setPrivate(&p, private)
	return p
}

func setPrivate(p *proto.UCMConnParam, b []byte) {
	p.PrivateDataLen = uint8(copy(p.PrivateData[:], b))
}

// request hands a REQ or SIDR_REQ to the listener that takes it, or
// refuses it as the kernel does when none does: REJ "invalid service ID",
// or SIDR status "unsupported".
func (u *ucmService) request(e *cm.Event) {
	ps, port, _ := cm.ServicePort(e.ServiceID)
	space := proto.PortSpaceTCP
	if ps == cm.PortSpaceUDP {
		space = proto.PortSpaceUDP
	}
	refuse := func(reason cm.RejectReason, status cm.SIDRStatus) {
		if space == proto.PortSpaceUDP {
			_ = u.ev.SIDRReply(e.ID, &cm.SIDRReplyParams{Status: status})
		} else {
			_ = u.ev.Reject(e.ID, reason, nil)
		}
	}
	dst := e.CMA.Dst.Unmap()
	var l *ucmID
	for _, o := range u.listeners[ucmPort{space, port}] {
		if o.covers(dst) && (l == nil || o.addr.IsValid()) {
			l = o // a listener bound to the address wins over a wildcard
		}
	}
	if l == nil || u.closed {
		u.stats.NoListener++
		refuse(cm.RejInvalidServiceID, cm.SIDRUnsupported)
		return
	}
	if l.queued >= l.backlog {
		u.stats.BacklogFull++
		refuse(cm.RejNoResources, cm.SIDRReject)
		return
	}
	ss := l.ss
	id := &ucmID{ss: ss, ch: l.ch, role: ucmPassive, space: space, conn: e.ID, listener: l,
		local: dst.As16(), peer: e.CMA.Src.Unmap().As16(), localPort: port, peerPort: e.CMA.SrcPort}
	var err error
	if id.h, err = u.newHandle(ss); err != nil {
		u.stats.Refused++
		refuse(cm.RejNoResources, cm.SIDRReject)
		return
	}
	l.queued++
	ss.ucm.ids[id.h] = id
	u.byConn[e.ID] = id
	ev := proto.UCMEvent{Event: proto.UCMEventConnectRequest, Listener: l.h, PKey: e.PKey}
	if space == proto.PortSpaceTCP {
		id.pathMTU = min(max8(e.QP.PathMTU, 1), u.s.portMTU())
		ev.PathMTU, ev.ACKTimeout = id.pathMTU, e.QP.Timeout
		ev.HopLimit, ev.TrafficClass, ev.FlowLabel = e.QP.HopLimit, e.QP.TrafficClass, e.QP.FlowLabel
		ev.PKey = e.QP.PKey
		ev.Param = connParam(&e.QP, e.Private())
	} else {
		ev.HopLimit = cm.DefaultHopLimit
		setPrivate(&ev.Param, e.Private())
	}
	u.emit(id, &ev)
}
