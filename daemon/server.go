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
	// MaxMRBytes bounds the memory one client may register (default 1 GiB).
	MaxMRBytes int64
	// MaxObjects bounds the PDs+MRs+CQs+QPs of one client (default 4096).
	MaxObjects int
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
	// CM, if set, is the device's rdma_cm agent, which clients' CM calls
	// use; the caller keeps it (and closes it after the server). If nil,
	// the server starts one on the device (its Config.Resolve finds peers'
	// MACs) and closes it when it closes. The agent answers peers from the
	// start: until one owns the GSI QP nothing answers a REQ, so a stock
	// peer connecting to a port no client listens on would wait out its
	// REQ retries instead of getting REJ "invalid service ID" at once.
	CM rdmacm.CM
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
	cm    rdmacm.CM     // nil: no rdma_cm for clients
	ownCM *rdmacm.Agent // the agent the server started, closed with it
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

	// The event router (async.go): the index from device objects to the
	// clients' (evMu), the daemon's own events, and its goroutine.
	evMu   sync.Mutex
	evQPs  map[uint32]*qpObj
	evCQs  map[*rnic.CQ]*cqObj
	evSRQs map[*rnic.SRQ]*srqObj
	evOwn  chan ownEvent
	evQuit chan struct{}
	evDone chan struct{}

	// Counters, read with atomic loads.
	BadWQEs         atomic.Uint64 // malformed entries found in client rings
	RejectedConn    atomic.Uint64 // connections refused by the credential check
	AsyncEventsLost atomic.Uint64 // events dropped: a client's queue (or the router's) was full
	// Wakes counts the engine wake-ups clients rang: posts that found the
	// engine asleep.
	Wakes atomic.Uint64
	// CQDoorbells counts the completions that rang a client's CQ
	// doorbell: completions for a client asleep on its CQs.
	CQDoorbells atomic.Uint64
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
	if opt.MaxMRBytes == 0 {
		opt.MaxMRBytes = 1 << 30
	}
	if opt.MaxObjects == 0 {
		opt.MaxObjects = 4096
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
		sessions: map[*session]struct{}{}, wakerEnd: make(chan struct{})}
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

// Serve accepts clients until Close. It returns nil after Close.
func (s *Server) Serve() error {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		s.startSession(c)
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
	for _, ss := range sessions {
		ss.conn.Close() // the session goroutine sees the close and cleans up
	}
	s.wg.Wait()
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
