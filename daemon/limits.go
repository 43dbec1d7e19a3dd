package daemon

import (
	"bufio"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
)

// Resource is what a limit bounds: something every client takes from the
// daemon's process (its file descriptors, its mappings, its memory) or
// from the device.
type Resource uint8

// The resources clients are limited in.
const (
	Connections Resource = iota // control connections
	FDs                         // file descriptors the daemon holds for a client
	Mappings                    // memory mappings the daemon holds for a client
	QPs
	CQs
	MRs
	MRBytes    // client memory the daemon maps (memfds) or reaches (address spaces)
	QueueBytes // memory of the queues: rings and the device's own WR and completion arrays
	Objects    // other handles of one connection: PDs, SRQs, AHs, address spaces, rdma_cm event channels, IDs and listeners
	NumResources
)

var resourceNames = [NumResources]string{"connections", "fds", "mappings", "qps", "cqs", "mrs", "mr-bytes", "queue-bytes", "objects"}

func (r Resource) String() string {
	if r < NumResources {
		return resourceNames[r]
	}
	return "resource" + strconv.Itoa(int(r))
}

// Scope is whose usage a limit bounds.
type Scope uint8

// The scopes of a limit: one connection, all connections of one uid, the
// whole daemon.
const (
	PerConn Scope = iota
	PerUID
	PerHost
	NumScopes
)

var scopeNames = [NumScopes]string{"conn", "uid", "host"}

func (s Scope) String() string {
	if s < NumScopes {
		return scopeNames[s]
	}
	return "scope" + strconv.Itoa(int(s))
}

// Limits bounds what clients may take, by resource and scope; 0 means the
// default (DefaultLimits), a negative value no limit. Per connection,
// Connections is always 1.
type Limits [NumResources][NumScopes]int64

// Host is what limits' defaults are sized from.
type Host struct {
	NoFile      int64 // RLIMIT_NOFILE (soft) of the daemon
	MaxMapCount int64 // vm.max_map_count
	Memory      int64 // physical memory, bytes
}

// ReadHost reads this host's figures: the process's RLIMIT_NOFILE,
// vm.max_map_count and MemTotal (Linux's defaults where one cannot be
// read).
func ReadHost() Host {
	h := Host{NoFile: 1024, MaxMapCount: 65530, Memory: 4 << 30}
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur != unix.RLIM_INFINITY {
		h.NoFile = int64(min(rl.Cur, 1<<30))
	}
	if b, err := os.ReadFile("/proc/sys/vm/max_map_count"); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 {
			h.MaxMapCount = n
		}
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				if kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64); err == nil && kb > 0 {
					h.Memory = kb << 10
				}
				break
			}
		}
		_ = f.Close() // read only
	}
	return h
}

// RaiseNoFile raises the process's RLIMIT_NOFILE soft limit to its hard
// limit (the systemd unit's LimitNOFILE) and returns the result: every
// client connection, CQ and QP costs the daemon file descriptors.
func RaiseNoFile() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			return 0, err
		}
	}
	return rl.Cur, nil
}

// What the daemon keeps for itself from the host's figures: file
// descriptors for its port (AF_XDP sockets, BPF maps), the metrics
// endpoint, logs; mappings for the Go runtime, UMEMs and XDP rings. Client
// mappings never come closer to vm.max_map_count than this, so that a
// detach (a mapping replaced in place, which the kernel refuses at the
// limit) always has room.
const (
	reservedFDs      = 256
	reservedMappings = 4096
)

// DefaultLimits sizes the limits from the host: file descriptors from
// RLIMIT_NOFILE, mappings from vm.max_map_count, bytes from physical
// memory. A uid gets half of the host, one connection a quarter (bytes
// of client memory: half), so that no single client can take everything.
func DefaultLimits(h Host) Limits {
	fds := max(h.NoFile-reservedFDs, 64)
	maps := max(h.MaxMapCount-max(reservedMappings, h.MaxMapCount/16), 64)
	var l Limits
	set := func(r Resource, host, uid, conn int64) {
		l[r] = [NumScopes]int64{PerConn: conn, PerUID: uid, PerHost: host}
	}
	// A connection costs two fds (its socket and its doorbell); a client
	// needs a few more for its first CQ and QP.
	conns := max(fds/8, 4)
	set(Connections, conns, max(conns/2, 2), 1)
	set(FDs, fds, fds/2, fds/4)
	set(Mappings, maps, maps/2, maps/4)
	set(QPs, 1<<16, 1<<14, 1<<12)
	set(CQs, 1<<16, 1<<14, 1<<12)
	set(MRs, 1<<20, 1<<18, 1<<17)
	set(MRBytes, h.Memory, h.Memory/2, h.Memory/2)
	set(QueueBytes, h.Memory/8, h.Memory/16, h.Memory/32)
	set(Objects, 1<<18, 1<<14, 1<<12)
	return l
}

// WithDefaults fills l's zero entries from d; negative entries stay (no
// limit).
func (l Limits) WithDefaults(d Limits) Limits {
	for r := range l {
		for s := range l[r] {
			if l[r][s] == 0 {
				l[r][s] = d[r][s]
			}
		}
	}
	l[Connections][PerConn] = 1
	return l
}

// errnoFor is what a request over a limit fails with, as the kernel would
// fail the like: too many files is EMFILE for a process (a connection, a
// uid) and ENFILE for the system (the host); too many connections of one
// user EAGAIN, as fork over RLIMIT_NPROC; memory and objects ENOMEM, as
// ibv_reg_mr over RLIMIT_MEMLOCK and a device out of QPs or CQs.
func errnoFor(r Resource, s Scope) unix.Errno {
	switch r {
	case Connections:
		return unix.EAGAIN
	case FDs:
		if s == PerHost {
			return unix.ENFILE
		}
		return unix.EMFILE
	default:
		return unix.ENOMEM
	}
}

// usage is what one connection, one uid or the host holds.
type usage [NumResources]int64

// uidUsage is one uid's usage, shared by its connections.
type uidUsage struct {
	usage
	conns int // connections holding it
}

// charge is an amount of one resource.
type charge struct {
	r Resource
	n int64
}

// accounts keeps every connection's, uid's and the host's usage against
// the limits. A charge is taken whole at every scope or not at all.
type accounts struct {
	lim Limits

	mu   sync.Mutex
	host usage
	uids map[uint32]*uidUsage

	refusals [NumResources][NumScopes]atomic.Uint64
	total    atomic.Uint64 // all refusals
}

func newAccounts(l Limits) *accounts {
	return &accounts{lim: l, uids: map[uint32]*uidUsage{}}
}

// account is one connection's usage and its uid's.
type account struct {
	a      *accounts
	uid    uint32
	conn   usage
	shared *uidUsage
	warned uint64 // bit r*NumScopes+s: refusal logged (under a.mu)
}

// join makes the account of a new connection of uid and charges the
// connection itself (Connections and its fds). It fails as take.
func (a *accounts) join(uid uint32) (*account, *limitError) {
	a.mu.Lock()
	defer a.mu.Unlock()
	u := a.uids[uid]
	if u == nil {
		u = &uidUsage{}
		a.uids[uid] = u
	}
	acc := &account{a: a, uid: uid, shared: u}
	u.conns++
	if err := acc.takeLocked(charge{Connections, 1}, charge{FDs, connFDs}); err != nil {
		acc.leaveLocked()
		return nil, err
	}
	return acc, nil
}

// leave gives back everything the connection still holds.
func (acc *account) leave() {
	acc.a.mu.Lock()
	defer acc.a.mu.Unlock()
	acc.leaveLocked()
}

func (acc *account) leaveLocked() {
	for r, n := range acc.conn {
		acc.shared.usage[r] -= n
		acc.a.host[r] -= n
	}
	acc.conn = usage{}
	if acc.shared.conns--; acc.shared.conns == 0 {
		delete(acc.a.uids, acc.uid)
	}
}

// limitError is a request refused by a limit.
type limitError struct {
	r          Resource
	s          Scope
	used, want int64
	limit      int64
	first      bool // the first refusal of this limit for this connection
}

func (e *limitError) Error() string {
	return fmt.Sprintf("over the %s limit of %s per %s: %d in use, %d more asked, limit %d (daemon limits.%s-per-%s)",
		e.r, e.r, e.s, e.used, e.want, e.limit, e.r, e.s)
}

// Errno is what the client receives.
func (e *limitError) Errno() unix.Errno { return errnoFor(e.r, e.s) }

// take charges cs at every scope, or nothing if any would go over its
// limit.
func (acc *account) take(cs ...charge) *limitError {
	acc.a.mu.Lock()
	defer acc.a.mu.Unlock()
	return acc.takeLocked(cs...)
}

// tryTake is take for a request that has a smaller fallback: a refusal
// is neither counted nor logged.
func (acc *account) tryTake(cs ...charge) bool {
	acc.a.mu.Lock()
	defer acc.a.mu.Unlock()
	if !acc.fitsLocked(cs) {
		return false
	}
	return acc.takeLocked(cs...) == nil
}

func (acc *account) fitsLocked(cs []charge) bool {
	a := acc.a
	for _, c := range cs {
		for s, used := range [NumScopes]int64{PerConn: acc.conn[c.r], PerUID: acc.shared.usage[c.r], PerHost: a.host[c.r]} {
			if lim := a.lim[c.r][s]; lim >= 0 && used+c.n > lim {
				return false
			}
		}
	}
	return true
}

func (acc *account) takeLocked(cs ...charge) *limitError {
	a := acc.a
	for _, c := range cs {
		for s, used := range [NumScopes]int64{PerConn: acc.conn[c.r], PerUID: acc.shared.usage[c.r], PerHost: a.host[c.r]} {
			if lim := a.lim[c.r][s]; lim >= 0 && used+c.n > lim {
				return a.refuseLocked(acc, c.r, Scope(s), used, c.n, lim)
			}
		}
	}
	for _, c := range cs {
		acc.conn[c.r] += c.n
		acc.shared.usage[c.r] += c.n
		a.host[c.r] += c.n
	}
	return nil
}

// refuse counts a refusal of want more of r (used in use, limit lim at
// scope s) by acc's connection.
func (a *accounts) refuse(acc *account, r Resource, s Scope, used, want, lim int64) *limitError {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.refuseLocked(acc, r, s, used, want, lim)
}

func (a *accounts) refuseLocked(acc *account, r Resource, s Scope, used, want, lim int64) *limitError {
	a.refusals[r][s].Add(1)
	a.total.Add(1)
	bit := uint64(1) << (int(r)*int(NumScopes) + int(s))
	first := acc.warned&bit == 0
	acc.warned |= bit
	return &limitError{r: r, s: s, used: used, want: want, limit: lim, first: first}
}

// held is how much of r the connection holds.
func (acc *account) held(r Resource) int64 {
	acc.a.mu.Lock()
	defer acc.a.mu.Unlock()
	return acc.conn[r]
}

// give returns cs.
func (acc *account) give(cs ...charge) {
	acc.a.mu.Lock()
	defer acc.a.mu.Unlock()
	for _, c := range cs {
		acc.conn[c.r] -= c.n
		acc.shared.usage[c.r] -= c.n
		acc.a.host[c.r] -= c.n
	}
}

// Usage is a snapshot of the host's usage and the limits, for stats.
type Usage struct {
	Host     [NumResources]int64
	Limits   Limits
	Refusals [NumResources][NumScopes]uint64
}

// Usage returns what clients hold of the host, the limits and how often
// each refused a request.
func (s *Server) Usage() Usage { return s.acct.snapshot() }

func (a *accounts) snapshot() Usage {
	a.mu.Lock()
	u := Usage{Host: a.host, Limits: a.lim}
	a.mu.Unlock()
	for r := range u.Refusals {
		for s := range u.Refusals[r] {
			u.Refusals[r][s] = a.refusals[r][s].Load()
		}
	}
	return u
}

// What the daemon holds per object (fds, mappings): a connection's socket
// and the fds one of its messages may carry (held while the daemon
// handles it, as are a new object's ring memfds until the reply went); a
// CQ's doorbell and its ring's mapping; a QP's SQ and RQ rings' mappings.
const (
	connFDs    = 1 + proto.MaxFDs
	cqFDs      = 1
	cqMappings = 1
	qpFDs      = 0
	qpMappings = 2
	openFDs    = 1 // the client's doorbell to the daemon
	// An address space holds the client's /proc/PID/mem and maps; its
	// MRs map nothing (the device copies through the mem file).
	addrSpaceFDs = 2
)

// cqQueueBytes is the memory of a CQ with a ring of slots: the ring,
// which is the device CQ's store (cqSink).
func cqQueueBytes(slots uint32) int64 {
	return int64(slots) * proto.CQESize
}

// qpQueueBytes is the memory of a QP with caps c (as normCaps granted):
// its SQ and RQ rings, the device's send and receive queues (a WQE with
// its SGEs, the inline buffer, a completion per send WR), and the WR
// decode buffers the engine fetches the rings into (rings.go).
func qpQueueBytes(c ib.QPCaps) int64 {
	sw, rw := int64(c.MaxSendWR), int64(c.MaxRecvWR)
	rings := sw*int64(proto.SendSlotSize(c)) + rw*int64(proto.RecvSlotSize(c))
	dev := sw*(sendWQEBytes+int64(c.MaxSendSGE)*segBytes+int64(c.MaxInline)+wcBytes) +
		rw*(recvWQEBytes+int64(c.MaxRecvSGE)*segBytes)
	fetch := fetchBatch * (sendWRBytes + recvWRBytes + int64(c.MaxSendSGE+c.MaxRecvSGE)*sgeBytes)
	return rings + dev + fetch
}

// bigRelease is queue memory whose release is worth handing back to the
// system at once, rather than when the Go runtime's scavenger gets to it.
const bigRelease = 64 << 20

// returnMemory hands memory back to the system after a client that held
// n bytes of queues went: the device's arrays are Go memory, which the
// runtime would otherwise keep for a while (a daemon whose RSS stays at
// its peak after a greedy client left looks like a leak, and is one for
// the other tenants of the host). At most one at a time, in the
// background.
func (s *Server) returnMemory(n int64) {
	if n < bigRelease || !s.freeing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.freeing.Store(false)
		debug.FreeOSMemory()
		time.Sleep(time.Second) // a client leaving after another does not pay a second GC at once
	}()
}
