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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/internal/shmring"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
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
// a Unix socket, checks who they are and serves control operations
// against its device, whose engine fetches work from the clients' SQ and
// RQ rings and writes completions into their CQ rings (rings.go).
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

	// The clients' doorbells (one eventfd per client, rung by a post that
	// finds its ring armed: the engine sleeps) are in one epoll set,
	// edge-triggered so that nothing needs draining, which the waker
	// goroutine waits on and turns into Device.Wake. A client owns only
	// its doorbell: it cannot steal or flood the others' wake-ups. db
	// stops the waker.
	epfd     int
	db       *shmring.Doorbell
	events   [64]unix.EpollEvent
	wakerEnd chan struct{}

	mu       sync.Mutex
	sessions map[*session]struct{}
	nextID   uint64
	closing  bool

	// ringsMu guards the engine's view of the rings: the engine holds it
	// for reading during a Fetch, Arm or Disarm; control operations hold
	// it for writing while they add or remove a QP or an SRQ, so that a
	// ring is never unmapped under the engine. detached: the server has
	// let go of the device (Close).
	ringsMu     sync.RWMutex
	qpList      []*qpObj
	srqList     []*srqObj
	detached    bool
	rings       queues
	idleFetches atomic.Uint64 // Fetch calls that found nothing (Close's drain)
	wg          sync.WaitGroup

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
	// CQRingDropped counts completions dropped on the full CQ rings of
	// destroyed CQs (cqRingDropped adds the live ones').
	CQRingDropped atomic.Uint64
	// AsyncEventsLost counts events dropped: a client's queue (or the
	// router's) was full.
	AsyncEventsLost atomic.Uint64
	// Wakes counts the engine wake-ups clients rang: posts that found the
	// engine asleep.
	Wakes atomic.Uint64
	// CQDoorbells counts the completions that rang a client's CQ
	// doorbell: completions for a client asleep on its CQs.
	CQDoorbells atomic.Uint64

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

// NewServer makes a server for dev, whose engine must be running, and
// attaches the clients' rings to dev (rnic.Device.SetQueues) until Close.
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
		sessions: map[*session]struct{}{}, wakerEnd: make(chan struct{}), acct: newAccounts(opt.Limits), reserve: -1,
		logged: map[string]time.Time{}}
	s.rings.s = s
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
	dev.SetQueues(&s.rings)
	go s.waker()
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

// watch adds a doorbell to the waker's epoll set (edge-triggered).
func (s *Server) watch(db *shmring.Doorbell) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(db.FD())}
	if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, db.FD(), &ev); err != nil {
		return fmt.Errorf("epoll: %w", err)
	}
	return nil
}

// unwatch removes a doorbell from the waker's epoll set.
func (s *Server) unwatch(db *shmring.Doorbell) {
	if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_DEL, db.FD(), nil); err != nil {
		s.log.Warn("epoll: removing a doorbell", "err", err)
	}
}

// waker turns clients' doorbells into engine wake-ups. It blocks in
// epoll_wait, and a client rings only when it finds its ring armed, which
// only an engine going to sleep does: while traffic flows it never runs.
func (s *Server) waker() {
	defer close(s.wakerEnd)
	for {
		n, err := unix.EpollWait(s.epfd, s.events[:], -1)
		if s.isClosing() {
			return
		}
		if err != nil && err != unix.EINTR {
			s.log.Error("waiting on client doorbells", "err", err)
			return
		}
		if n > 0 {
			s.Wakes.Add(1)
			s.dev.Wake()
		}
	}
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
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
// move every QP to the error state, then let the engine fetch from the
// rings until nothing moves (bounded by drain), so that work still in the
// clients' rings and work outstanding in the device all completes with
// flush errors the clients can poll; then detach from the device, close
// every connection and release everything.
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
	_ = s.db.Ring() // its own eventfd, closed only below; the waker stops: from here on Close wakes the engine itself
	<-s.wakerEnd
	for _, ss := range sessions {
		ss.errorAllQPs()
	}
	// Two fetches that found nothing after the QPs went to error: every
	// ring is empty and its WRs flushed (a stopped engine never gets
	// there; drain bounds the wait).
	deadline := time.Now().Add(drain)
	for start := s.idleFetches.Load(); s.idleFetches.Load()-start < 2 && time.Now().Before(deadline); {
		s.dev.Wake()
		time.Sleep(time.Millisecond)
	}
	s.ringsMu.Lock()
	s.detached = true
	s.ringsMu.Unlock()
	s.dev.SetQueues(nil)
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
