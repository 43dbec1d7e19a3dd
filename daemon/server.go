package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/internal/shmring"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// Options tune a Server.
type Options struct {
	Logger *slog.Logger
	// Group is the gid whose members may use the RNIC besides root and the
	// daemon's own user; -1 for none.
	Group int
	// Mode is the control socket's permission bits (default 0660).
	Mode os.FileMode
	// Limits bound what clients may take, per connection, per uid and
	// for the host (limits.go); zero entries take DefaultLimits of the
	// host (ReadHost).
	Limits Limits
	// OpenTimeout is how long a connection may stay silent before its
	// OPEN: a peer that connects and never speaks holds a file descriptor
	// of the daemon, so it is closed (default 1 s).
	OpenTimeout time.Duration
	// SpinFor is how long the ring pump keeps polling after its last work
	// before it sleeps on its doorbell (default 50 µs, as the engine):
	// longer lowers latency under light load and costs CPU.
	SpinFor time.Duration
	// Tap, if set, is the engine's capture tap, which root clients may
	// start captures on (OpCapture).
	Tap *capture.Tap
	// PortStatus, if set, describes the port for OpStatus (softrnic
	// status). Called from control goroutines.
	PortStatus func() proto.PortStatus
	// Counters, if set, snapshots the counters for OpStats (softrnic
	// stats), e.g. CounterSource.Snapshot. Called from control goroutines.
	Counters func() Counters
	// OnClientGone, if set, is called after a client's connection closed and
	// all its resources were released.
	OnClientGone func(ClientInfo)
	// CM, if set, is the device's rdma_cm agent, whose event interface
	// serves the clients' rdma_cm (ucm.go); the caller keeps it (and
	// closes it after the server). If nil, the server starts one on the
	// device (its Config.Resolve finds peers' MACs) and closes it when it
	// closes. The agent answers peers from the start: until one owns the
	// GSI QP nothing answers a REQ, so a stock peer connecting to a port
	// no client listens on would wait out its REQ retries instead of
	// getting REJ "invalid service ID" at once.
	CM *rdmacm.Agent
}

// ClientInfo describes a client connection (for logs, status and tests).
type ClientInfo struct {
	ID       uint64
	PID      int32
	UID, GID uint32
	// Released counts the resources freed when the client went away.
	QPs, CQs, MRs, PDs, AHs int
}

// Server is the daemon's control server: it accepts client connections on
// a Unix socket, checks who they are, serves control operations against
// its device, and runs the ring pump that moves work requests from clients' SQ
// and RQ rings to the device and completions from the device to clients' CQ
// rings.
type Server struct {
	dev   *rnic.Device
	info  proto.DeviceInfo
	cm    *rdmacm.Agent // nil: no rdma_cm for clients
	ownCM *rdmacm.Agent // the agent the server started, closed with it
	ucm   *ucmService   // rdma_cm for librdmacm (ucm.go); nil without an agent
	opt   Options
	log   *slog.Logger

	ln   *net.UnixListener
	path string

	// The pump sleeps in epoll_wait on its own doorbell (device
	// completions, shutdown) and on one doorbell per client (posts), all
	// edge-triggered so that nothing needs draining. A client owns only its
	// doorbell: it cannot steal or flood the others' wakeups.
	epfd   int
	db     *shmring.Doorbell
	events [64]unix.EpollEvent

	mu       sync.Mutex
	sessions map[*session]struct{}
	nextID   uint64
	closing  bool

	// ringsMu guards the pump's lists; the pump holds it for reading during
	// one pass, control operations for writing while they add or remove a
	// queue (so that a ring is never unmapped under the pump).
	ringsMu  sync.RWMutex
	qpList   []*qpObj
	cqList   []*cqObj
	srqList  []*srqObj
	sleeping atomic.Bool
	stop     atomic.Bool
	pumpDone chan struct{}
	wg       sync.WaitGroup

	acct    *accounts // usage against the limits
	logMu   sync.Mutex
	logged  map[string]time.Time // refusals of connections logged, by why and uid (firstIn)
	freeing atomic.Bool          // returnMemory is running
	reserve int                  // an fd kept free to turn away connections when out of fds (Serve's)

	// Counters, read with atomic loads.
	BadWQEs      atomic.Uint64 // malformed entries found in client rings
	RejectedConn atomic.Uint64 // connections refused by the credential check
	AcceptErrors atomic.Uint64 // accept failures (out of fds, out of memory, aborted)
	// ShedConns counts connections the daemon closed to keep serving:
	// peers silent past OpenTimeout, and the newest when it is out of fds.
	ShedConns atomic.Uint64
	// QKeyRefused counts controlled Q_Keys (high bit set) refused to
	// clients without CAP_NET_RAW.
	QKeyRefused atomic.Uint64
	// CQRingDropped counts completions dropped on a full client CQ ring.
	CQRingDropped atomic.Uint64
	// AsyncEventsLost counts events dropped: a client's queue (or the
	// router's) was full.
	AsyncEventsLost atomic.Uint64

	// The event router (async.go): the index from device objects to the
	// clients' (evMu), the daemon's own events, and its goroutine.
	evMu   sync.Mutex
	evQPs  map[uint32]*qpObj
	evCQs  map[*rnic.CQ]*cqObj
	evSRQs map[*rnic.SRQ]*srqObj
	evOwn  chan ownEvent
	evQuit chan struct{}
	evDone chan struct{}
}

// NewServer makes a server for dev and starts its ring pump. The server
// drives dev from its pump (Poll) while it spins; an engine goroutine runs
// it otherwise.
func NewServer(dev *rnic.Device, opt Options) (*Server, error) {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.Mode == 0 {
		opt.Mode = 0o660
	}
	opt.Limits = opt.Limits.WithDefaults(DefaultLimits(ReadHost()))
	if opt.OpenTimeout == 0 {
		opt.OpenTimeout = time.Second
	}
	if opt.SpinFor == 0 {
		opt.SpinFor = 50 * time.Microsecond
	}
	db, err := shmring.NewDoorbell()
	if err != nil {
		return nil, err
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("epoll: %w", err)
	}
	s := &Server{dev: dev, info: deviceInfo(dev), cm: opt.CM, opt: opt, log: opt.Logger, db: db, epfd: epfd,
		sessions: map[*session]struct{}{}, pumpDone: make(chan struct{}), acct: newAccounts(opt.Limits), reserve: -1,
		logged: map[string]time.Time{}}
	if err := s.watch(db); err != nil {
		db.Close()
		unix.Close(epfd)
		return nil, err
	}
	if s.cm == nil {
		a, err := rdmacm.New(rdmacm.Config{Device: dev, Resolve: dev.Config().Resolve})
		if err != nil {
			s.log.Warn("rdma_cm agent not started: clients' CM calls will fail", "err", err)
		} else {
			s.cm, s.ownCM = a, a
		}
	}
	if s.cm != nil {
		if err := s.startUCM(s.cm); err != nil {
			s.log.Warn("rdma_cm service not started: librdmacm's connections will fail", "err", err)
		}
	}
	s.startEvents()
	go s.pump()
	return s, nil
}

// deviceInfo is OPEN's reply: the device's attributes and GID table.
func deviceInfo(dev *rnic.Device) proto.DeviceInfo {
	var in proto.DeviceInfo
	copy(in.Name[:len(in.Name)-1], dev.Name())
	in.DeviceAttr = dev.Query()
	for i, a := range dev.GIDs() {
		if i == len(in.GIDs) {
			break
		}
		in.GIDs[i] = a.As16()
		in.NumGIDs++
	}
	return in
}

// watch adds a doorbell to the pump's epoll set (edge-triggered).
func (s *Server) watch(db *shmring.Doorbell) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(db.FD())}
	if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, db.FD(), &ev); err != nil {
		return fmt.Errorf("epoll: %w", err)
	}
	return nil
}

// unwatch removes a doorbell from the pump's epoll set.
func (s *Server) unwatch(db *shmring.Doorbell) {
	if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_DEL, db.FD(), nil); err != nil {
		s.log.Warn("epoll: removing a doorbell", "err", err)
	}
}

// sleep blocks until some doorbell rings or timeout passes. Edge-triggered
// eventfds need no draining: every write is a new edge.
func (s *Server) sleep(timeout time.Duration) {
	for {
		_, err := unix.EpollWait(s.epfd, s.events[:], int(timeout/time.Millisecond))
		if err != unix.EINTR {
			return
		}
	}
}

// Listen creates the control socket at path, with the configured mode and
// group. An existing socket that still answers belongs to a running daemon:
// Listen refuses to take it over. A stale one is replaced.
func (s *Server) Listen(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("control socket %s: exists and is not a socket", path)
		}
		if c, err := net.Dial("unixpacket", path); err == nil {
			c.Close()
			return fmt.Errorf("control socket %s: another softrnic daemon is serving it", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("control socket %s: stale: %w", path, err)
		}
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return err
	}
	if err := os.Chmod(path, s.opt.Mode); err != nil {
		ln.Close()
		return err
	}
	if s.opt.Group >= 0 {
		if err := os.Chown(path, -1, s.opt.Group); err != nil {
			ln.Close()
			return err
		}
	}
	ln.SetUnlinkOnClose(true)
	s.ln, s.path = ln, path
	return nil
}

// Serve accepts clients until Close, and returns nil then. Nothing a
// client does stops it: a failed accept (out of file descriptors or
// memory, a connection aborted) is counted and retried after a pause that
// doubles up to a second, and when the daemon is out of file descriptors
// the newest connection is turned away (shed) so that the others keep
// being served.
func (s *Server) Serve() error {
	s.reserveFD()
	defer func() {
		if s.reserve >= 0 {
			unix.Close(s.reserve)
			s.reserve = -1
		}
	}()
	var pause time.Duration
	var logged time.Time
	for {
		c, err := s.ln.AcceptUnix()
		if err == nil {
			pause = 0
			s.admit(c)
			continue
		}
		if s.isClosing() {
			return nil
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		s.AcceptErrors.Add(1)
		if (errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE)) && s.shedNewest(errnoOfAccept(err)) {
			pause = 0
			continue
		}
		if time.Since(logged) >= 10*time.Second {
			s.log.Warn("accepting a client failed; retrying", "err", err, "accept_errors", s.AcceptErrors.Load())
			logged = time.Now()
		}
		pause = min(max(2*pause, 5*time.Millisecond), time.Second)
		time.Sleep(pause)
	}
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

func errnoOfAccept(err error) unix.Errno {
	if errors.Is(err, unix.ENFILE) {
		return unix.ENFILE
	}
	return unix.EMFILE
}

// shedNewest turns away the connection at the head of the listen queue
// when accept fails for want of file descriptors: it frees the fd kept in
// reserve, accepts with it, tells the peer why (no as its OPEN's errno)
// and closes. Without it the queued connection would make every later
// accept fail at once, and its client would wait for ever. It reports
// whether it turned one away.
func (s *Server) shedNewest(no unix.Errno) bool {
	if s.reserve >= 0 {
		unix.Close(s.reserve)
		s.reserve = -1
	}
	shed := false
	if rc, err := s.ln.SyscallConn(); err == nil {
		_ = rc.Control(func(lfd uintptr) { // fails only for a closed listener: nothing shed
			fd, _, err := unix.Accept4(int(lfd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
			if err != nil {
				return
			}
			refuseFD(fd, no, "the daemon is out of file descriptors; try again later")
			unix.Close(fd)
			s.ShedConns.Add(1)
			shed = true
		})
	}
	s.reserveFD()
	return shed
}

// reserveFD keeps one file descriptor in reserve for shedNewest.
func (s *Server) reserveFD() {
	if s.reserve < 0 {
		if fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			s.reserve = fd
		}
	}
}

// admit decides on a new connection at once: a peer that may not use the
// RNIC, or whose uid is at its connection limit, is told why (as the
// errno of its OPEN) and closed without holding anything; the others
// become sessions.
func (s *Server) admit(c *net.UnixConn) {
	cr, err := peerCred(c)
	if err != nil {
		s.log.Warn("control connection without credentials", "err", err)
		c.Close()
		return
	}
	if !s.allowed(cr) {
		s.RejectedConn.Add(1)
		if s.firstIn("refused", cr.Uid) {
			s.log.Warn("client refused: neither root nor in the control group (logged once a minute per uid)", "pid", cr.Pid, "uid", cr.Uid, "gid", cr.Gid)
		}
		refuse(c, unix.EPERM, fmt.Sprintf("uid %d gid %d may not use this RNIC: only root and the control group may", cr.Uid, cr.Gid))
		return
	}
	acc, lerr := s.acct.join(cr.Uid)
	if lerr != nil {
		if s.firstIn("limit", cr.Uid) {
			s.log.Warn("client refused: over a limit (logged once a minute per uid)", "pid", cr.Pid, "uid", cr.Uid, "limit", lerr.r.String()+"-per-"+lerr.s.String(), "value", lerr.limit)
		}
		refuse(c, lerr.Errno(), lerr.Error())
		return
	}
	s.startSession(c, cr, acc)
}

// firstIn reports whether uid's connections were not refused for why in
// the last minute: a flood of connections is logged once, not once per
// connection.
func (s *Server) firstIn(why string, uid uint32) bool {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	k := why + "/" + strconv.FormatUint(uint64(uid), 10)
	now := time.Now()
	if t, ok := s.logged[k]; ok && now.Sub(t) < time.Minute {
		return false
	}
	if len(s.logged) >= 1024 {
		clear(s.logged) // a bound: at worst, some are logged again
	}
	s.logged[k] = now
	return true
}

// refuse answers a connection's OPEN before it is sent, and closes it.
func refuse(c *net.UnixConn, no unix.Errno, msg string) {
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { refuseFD(int(fd), no, msg) }) // closed anyway below
	}
	c.Close()
}

// refuseFD sends the refusal: an OPEN reply with Seq 0 carrying no and
// msg, which the client takes as the answer to its OPEN. What the peer
// already sent is read first: closing a socket with unread data would
// reset the peer's end and drop the refusal with it.
func refuseFD(fd int, no unix.Errno, msg string) {
	var buf [proto.MaxMessage]byte
	oob := make([]byte, unix.CmsgSpace(4*proto.MaxFDs))
	for i := 0; i < 4; i++ {
		n, oobn, _, _, err := unix.Recvmsg(fd, buf[:], oob, unix.MSG_DONTWAIT)
		if err != nil || n == 0 && oobn == 0 {
			break
		}
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for i := range msgs {
				if fds, err := unix.ParseUnixRights(&msgs[i]); err == nil {
					proto.CloseFDs(fds)
				}
			}
		}
	}
	out, err := proto.Encode(buf[:0], proto.Header{Op: proto.OpOpen, Version: proto.Version, Errno: uint32(no)}, []byte(msg))
	if err == nil {
		// Best effort: a peer that is gone or not reading loses its answer.
		_, _ = unix.SendmsgN(fd, out, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
	}
}

// Lock takes the per-interface lock file dir/IFACE.lock, so that a second
// daemon on the same interface is refused with a message naming the first.
// The lock is released when the returned file is closed or the process dies.
func Lock(dir, iface string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	name := filepath.Join(dir, iface+".lock")
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		_ = f.Close() // read only, and the lock is what to report
		pid := strings.TrimSpace(string(b[:n]))
		return nil, fmt.Errorf("a softrnic daemon (pid %s) already runs on %s (lock %s)", pid, iface, name)
	}
	// The pid is for the message above, in the daemon that finds the
	// lock taken.
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	return f, nil
}

// Clients lists the connected clients.
func (s *Server) Clients() []ClientInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ClientInfo
	for ss := range s.sessions {
		ss.mu.Lock()
		out = append(out, ClientInfo{ID: ss.id, PID: ss.cred.Pid, UID: ss.cred.Uid, GID: ss.cred.Gid,
			QPs: len(ss.qps), CQs: len(ss.cqs), MRs: len(ss.mrs), PDs: len(ss.pds), AHs: len(ss.ahs)})
		ss.mu.Unlock()
	}
	return out
}

// Close shuts the server down the way SIGTERM asks: stop accepting clients,
// move every QP to the error state, then pass over every ring until nothing
// moves (bounded by drain), so that work still in the clients' rings and
// work outstanding in the device all completes with flush errors the
// clients can poll; then close every connection and release everything.
func (s *Server) Close(drain time.Duration) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	sessions := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	if s.ln != nil {
		s.ln.Close()
	}
	// The pump stops first: from here on this goroutine is the rings' only
	// consumer and the CQ rings' only producer.
	s.stop.Store(true)
	_ = s.db.Ring() // the pump's own eventfd: it fails only once closed, below
	<-s.pumpDone
	for _, ss := range sessions {
		ss.errorAllQPs()
	}
	deadline := time.Now().Add(drain)
	for idle := 0; idle < 2 && time.Now().Before(deadline); {
		if s.pollOnce() == 0 {
			idle++
			time.Sleep(time.Millisecond) // completions of in-flight device work
		} else {
			idle = 0
		}
	}
	if s.ucm != nil {
		s.ucm.shutdown(drain) // DEVICE_REMOVAL on every event channel
	}
	for _, ss := range sessions {
		ss.conn.Close() // the session goroutine sees the close and cleans up
	}
	s.wg.Wait()
	if s.ucm != nil {
		s.ucm.close()
	}
	s.stopEvents()
	if s.ownCM != nil {
		// The CM agent's GSI QP and its goroutine.
		if err := s.ownCM.Close(); err != nil {
			s.log.Warn("closing the rdma_cm agent", "err", err)
		}
	}
	unix.Close(s.epfd)
	return s.db.Close()
}

// wake is the device's completion notification: one atomic load unless the
// pump sleeps.
func (s *Server) wake() {
	if s.sleeping.Load() {
		_ = s.db.Ring() // the pump's own eventfd: it fails only once closed, with the pump gone
	}
}

// pump moves work from clients' SQ/RQ rings to the device and completions
// from the device to clients' CQ rings. It keeps polling for SpinFor after
// its last work, then arms every ring's wakeup flag and sleeps on the
// doorbell, so an idle daemon costs no CPU and a busy one no syscalls.
func (s *Server) pump() {
	defer close(s.pumpDone)
	last := time.Now()
	for !s.stop.Load() {
		if s.pollOnce() > 0 {
			last = time.Now()
			continue
		}
		if time.Since(last) < s.opt.SpinFor {
			// While it spins, the pump is the clients' busy-polling
			// application: it drives the device's step itself (as
			// ibv_poll_cq does on rxe or mlx5, and as an in-process tool
			// does through rnic.Device.Poll), so that a client's post
			// and the frames that answer it need not wait for the engine
			// goroutine to wake from a nap (README, "Design
			// decisions", has the figures).
			if s.dev.Poll() {
				last = time.Now()
				continue
			}
			runtime.Gosched()
			continue
		}
		s.sleeping.Store(true)
		if s.armAll() && s.pollOnce() == 0 {
			// The timeout bounds how long completions can wait behind a
			// full CQ ring that its client has since drained (the client
			// does not ring the daemon when it consumes).
			s.sleep(50 * time.Millisecond)
		}
		s.sleeping.Store(false)
		s.disarmAll()
		last = time.Now()
	}
}

func (s *Server) armAll() bool {
	s.ringsMu.RLock()
	defer s.ringsMu.RUnlock()
	empty := true
	for _, q := range s.qpList {
		if q.broken {
			continue
		}
		if !q.sqc.Arm() || !q.rqc.Arm() {
			empty = false
		}
	}
	for _, x := range s.srqList {
		if !x.broken && !x.cons.Arm() {
			empty = false
		}
	}
	return empty
}

func (s *Server) disarmAll() {
	s.ringsMu.RLock()
	defer s.ringsMu.RUnlock()
	for _, q := range s.qpList {
		q.sqc.Disarm()
		q.rqc.Disarm()
	}
	for _, x := range s.srqList {
		x.cons.Disarm()
	}
}

// pumpBatch bounds the entries taken from one ring per pass, for fairness
// between QPs and clients.
const pumpBatch = 64

// pollOnce is one pass over every ring. It first notes how many send WRs
// each SQ holds, then drains every RQ, then executes the noted send WRs: a
// receive a client posted before a peer's SEND was posted is therefore
// always with the device before that SEND executes.
func (s *Server) pollOnce() int {
	work := 0
	s.ringsMu.RLock()
	for _, q := range s.qpList {
		if !q.broken {
			q.sqReady = min(q.sqc.Len(), pumpBatch)
		}
	}
	for _, q := range s.qpList {
		if !q.broken {
			work += s.drainRQ(q)
		}
	}
	for _, x := range s.srqList {
		if !x.broken {
			work += s.drainSRQ(x)
		}
	}
	for _, q := range s.qpList {
		if !q.broken {
			work += s.drainSQ(q)
		}
	}
	for _, c := range s.cqList {
		c.mu.Lock()
		work += s.moveCQ(c)
		c.mu.Unlock()
	}
	s.ringsMu.RUnlock()
	return work
}

func (s *Server) drainRQ(q *qpObj) int {
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	n := 0
	for ; n < pumpBatch; n++ {
		slot := q.rqc.Peek()
		if slot == nil {
			break
		}
		w := &q.rwr[0]
		if err := proto.GetRecvWR(slot, w); err != nil {
			s.badWQE(q, q.recv, w.ID, true, err)
			continue
		}
		if _, err := q.qp.PostRecv(q.rwr[:]); errors.Is(err, verbs.ErrQueueFull) {
			q.rqc.Unpeek()
			break
		} else if errors.Is(err, verbs.ErrQPState) || errors.Is(err, verbs.ErrDestroyed) {
			s.failWR(q, q.recv, w.ID, true, err)
		} else if err != nil {
			// A receive WR failing the device's checks is a receive
			// queue error: ERR whatever the QP's type (IBA 10.3.1),
			// counted as a bad WQE.
			s.badWQE(q, q.recv, w.ID, true, err)
		}
	}
	q.rqc.Release()
	s.checkRings(q)
	return n
}

// refillRQ is the QP's receive refill (rnic.QP.SetRecvRefill): when a
// message finds the device's RQ empty, the engine moves the receives the
// client has already posted to its ring, so that a UC or UD message sent
// right after the client posted its receive (and told its peer so) is not
// dropped, nor an RC one answered with an RNR NAK, for want of the pump
// having run. It never waits: if the pump is draining this ring, the
// receives are on their way; an entry the device does not take as it is
// is left to the pump, which fails it properly.
func (q *qpObj) refillRQ(post func(*verbs.RecvWR) bool) {
	if !q.rqMu.TryLock() {
		return
	}
	defer q.rqMu.Unlock()
	for q.rqc.Err() == nil {
		slot := q.rqc.Peek()
		if slot == nil {
			break
		}
		w := &q.rwr[0]
		if proto.GetRecvWR(slot, w) != nil || !post(w) {
			q.rqc.Unpeek()
			break
		}
	}
	q.rqc.Release()
}

func (s *Server) drainSQ(q *qpObj) int {
	n := 0
	for ; n < q.sqReady; n++ {
		slot := q.sqc.Peek()
		if slot == nil {
			break
		}
		w := &q.swr[0]
		ah, err := proto.GetSendWR(slot, w, q.typ == ib.UD)
		if err != nil {
			if !s.sendInError(q, w.ID, w.Opcode, err) {
				break
			}
			continue
		}
		if q.typ == ib.UD {
			// An unknown handle leaves w.AH nil: the device completes the
			// WR in error, as for a destroyed AH.
			if a := q.owner.lookupAH(ah); a != nil {
				w.AH = a
			}
		}
		if _, err := q.qp.PostSend(q.swr[:]); errors.Is(err, verbs.ErrQueueFull) {
			q.sqc.Unpeek()
			break
		} else if err != nil && !s.sendInError(q, w.ID, w.Opcode, err) {
			break
		}
	}
	q.sqc.Release()
	s.checkRings(q)
	return n
}

// checkRings retires a QP whose client scribbled over its ring indexes.
func (s *Server) checkRings(q *qpObj) {
	if q.broken || (q.sqc.Err() == nil && q.rqc.Err() == nil) {
		return
	}
	s.BadWQEs.Add(1)
	q.broken = true
	attr := ib.QPAttr{State: ib.Err}
	err := q.qp.Modify(&attr, ib.AttrState)
	s.ownEvent(q.owner, proto.AsyncEventMsg{Type: ib.EventQPFatal, Handle: q.h, QPN: q.qp.QPN()})
	s.log.Warn("client corrupted a work queue ring; QP moved to error", "client", q.owner.id, "qpn", q.qp.QPN(), "err", err)
}

// sendInError completes a send WR the device refused as an RNIC completes
// a bad WQE: in order, after the WRs before it, and then the QP stops (ERR
// for RC, SQE for UC and UD), where ibv_post_send would have refused it
// before it reached a queue. A QP not yet able to send gets the error
// completion straight away. It is false when the SQ is full: the entry
// stays in the ring for the next pass.
func (s *Server) sendInError(q *qpObj, id uint64, op ib.WROpcode, err error) bool {
	st := ib.LocQPOpErr
	var se interface{ Status() ib.WCStatus }
	if errors.As(err, &se) {
		st = se.Status()
	}
	switch perr := q.qp.PostSendInError(id, op, st); {
	case errors.Is(perr, verbs.ErrQueueFull):
		q.sqc.Unpeek()
		return false
	case perr != nil:
		s.failWR(q, q.send, id, false, err)
	}
	s.BadWQEs.Add(1)
	return true
}

// badWQE handles an entry that does not decode: like a malformed WQE on a
// hardware RNIC, it completes in error and the QP goes to the error state.
func (s *Server) badWQE(q *qpObj, cq *cqObj, id uint64, recv bool, err error) {
	s.BadWQEs.Add(1)
	attr := ib.QPAttr{State: ib.Err}
	if q.qp.State() != ib.Err {
		s.ownEvent(q.owner, proto.AsyncEventMsg{Type: ib.EventQPFatal, Handle: q.h, QPN: q.qp.QPN()})
	}
	if merr := q.qp.Modify(&attr, ib.AttrState); merr != nil {
		s.log.Warn("bad WQE: moving QP to error", "client", q.owner.id, "qpn", q.qp.QPN(), "err", merr)
	}
	s.failWR(q, cq, id, recv, err)
}

// failWR writes an error completion for a WR the device did not accept
// straight into the client's CQ ring (the pump is that ring's only
// producer, so this keeps it single-producer).
func (s *Server) failWR(q *qpObj, cq *cqObj, id uint64, recv bool, err error) {
	st := ib.LocQPOpErr
	var se interface{ Status() ib.WCStatus }
	if errors.As(err, &se) {
		st = se.Status()
	}
	wc := ib.WC{ID: id, Status: st, QPN: q.qp.QPN(), IsRecv: recv}
	if recv {
		wc.Opcode = ib.WCRecv
	}
	cq.mu.Lock()
	if slot := cq.prod.Reserve(); slot != nil {
		proto.PutWC(slot, &wc)
		s.commit(cq, true) // in error: solicited, per IBA
	} else {
		cq.overruns++
		s.CQRingDropped.Add(1)
		if cq.overruns == 1 {
			s.ownEvent(cq.owner, proto.AsyncEventMsg{Type: ib.EventCQErr, Handle: cq.h})
		}
	}
	cq.mu.Unlock()
}

// moveCQ copies what fits of the device CQ into the client's CQ ring.
// Caller holds c.mu.
func (s *Server) moveCQ(c *cqObj) int {
	free := c.prod.Free()
	if free == 0 {
		return 0
	}
	if free > len(c.wcs) {
		free = len(c.wcs)
	}
	n := c.cq.Poll(c.wcs[:free])
	solicited := false
	for i := 0; i < n; i++ {
		w := &c.wcs[i]
		proto.PutWC(c.prod.Reserve(), w)
		// What wakes a CQ armed for solicited completions only: a
		// message with SE, and any completion in error (IBA 11.4.2.2).
		solicited = solicited || w.Flags&ib.WCSolicited != 0 || w.Status != ib.Success
	}
	if n > 0 {
		s.commit(c, solicited)
	}
	return n
}

// commit publishes the completions written into c's ring (c.mu held),
// waking a consumer armed for solicited completions only if solicited. A
// ring the client corrupted, or whose doorbell failed, is logged once; the
// client is the only one it harms.
func (s *Server) commit(c *cqObj, solicited bool) {
	if _, err := c.prod.CommitSolicited(solicited); err != nil && !c.ringErr {
		c.ringErr = true
		s.log.Warn("client CQ ring", "err", err)
	}
}

// allowed decides whether a peer may use the RNIC: root, the daemon's own
// user, or a member (primary or supplementary) of the configured group.
// The socket's file mode is the first gate; this is the second, and the one
// that still holds if the socket file is chmod'ed by mistake.
func (s *Server) allowed(cr *unix.Ucred) bool {
	if cr.Uid == 0 || cr.Uid == uint32(os.Geteuid()) {
		return true
	}
	if s.opt.Group < 0 {
		return false
	}
	if cr.Gid == uint32(s.opt.Group) {
		return true
	}
	return inGroups(cr.Pid, uint32(s.opt.Group))
}

// inGroups reads the supplementary groups of pid (SO_PEERCRED carries only
// the primary group).
func inGroups(pid int32, gid uint32) bool {
	f, err := os.Open("/proc/" + strconv.Itoa(int(pid)) + "/status")
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }() // read only
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Groups:"); ok {
			for _, g := range strings.Fields(rest) {
				if n, err := strconv.ParseUint(g, 10, 32); err == nil && uint32(n) == gid {
					return true
				}
			}
			return false
		}
	}
	return false
}

// hasNetRaw reports whether the peer may use controlled Q_Keys (the high
// bit set): the kernel lets a UD QP take one only with CAP_NET_RAW in the
// initial user namespace (ib_uverbs' modify_qp), which root normally has.
// The connecting process's capabilities are read once, as SO_PEERCRED's
// credentials are.
func hasNetRaw(cr *unix.Ucred) bool {
	dir := "/proc/" + strconv.Itoa(int(cr.Pid))
	ns, err1 := os.Readlink(dir + "/ns/user")
	own, err2 := os.Readlink("/proc/self/ns/user")
	if err1 != nil || err2 != nil || ns != own {
		return false
	}
	f, err := os.Open(dir + "/status")
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }() // read only
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(rest), 16, 64)
			return err == nil && caps&(1<<unix.CAP_NET_RAW) != 0
		}
	}
	return false
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cr *unix.Ucred
	var serr error
	err = rc.Control(func(fd uintptr) { cr, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if err == nil {
		err = serr
	}
	return cr, err
}
