package netnstest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

var seq atomic.Uint32

// Unique returns a name of at most 15 bytes (an interface name's limit):
// prefix (at most 4 bytes), the pid and a random suffix.
func Unique(prefix string) string {
	if len(prefix) > 4 {
		prefix = prefix[:4]
	}
	var r [2]byte
	rand.Read(r[:])
	return fmt.Sprintf("%s%d%s%d", prefix, os.Getpid()%100000, hex.EncodeToString(r[:]), seq.Add(1)%100)
}

// NS is a network namespace made by this package.
type NS struct {
	Name   string
	handle netns.NsHandle
}

// ip runs ip(8) with a bounded time.
func ip(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// nsPrefix starts every namespace this package makes; the creator's pid
// follows, so that namespaces left by a process that died before its cleanup
// ran (a test binary killed by -timeout, say) can be recognised and removed.
const nsPrefix = "srn-"

var sweepOnce sync.Once

// sweep removes namespaces made by this package in processes that no longer
// exist. It runs once per process, before the first Create.
func sweep() {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), nsPrefix)
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, os.ErrNotExist) {
			_, _ = ip("netns", "del", e.Name()) // best effort: one still in use stays
		}
	}
}

// Create makes a namespace with a unique name (it includes tag and the pid)
// and brings its loopback up. The caller must Close it.
func Create(tag string) (*NS, error) {
	sweepOnce.Do(sweep)
	var r [3]byte
	rand.Read(r[:])
	name := fmt.Sprintf("%s%d-%s-%s%d", nsPrefix, os.Getpid(), tag, hex.EncodeToString(r[:]), seq.Add(1))
	if _, err := ip("netns", "add", name); err != nil {
		return nil, err
	}
	n := &NS{Name: name}
	h, err := netns.GetFromName(name)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("netnstest: open %s: %w", name, err), n.Close())
	}
	n.handle = h
	if _, err := n.IP("link", "set", "lo", "up"); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	// No duplicate address detection: test links are private, and DAD would
	// keep link-local addresses (hence neighbour discovery) unusable for
	// about a second after each link comes up.
	for _, k := range []string{"net.ipv6.conf.all.accept_dad", "net.ipv6.conf.default.accept_dad"} {
		if err := n.Sysctl(k, "0"); err != nil {
			return nil, errors.Join(err, n.Close())
		}
	}
	return n, nil
}

// Sysctl sets a per-namespace kernel parameter (net.*) inside the namespace,
// by writing /proc/sys from a thread in it (no sysctl(8) needed).
func (n *NS) Sysctl(key, value string) error {
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	return n.Do(func() error {
		if err := os.WriteFile(path, []byte(value), 0); err != nil {
			return fmt.Errorf("netnstest: %s=%s in %s: %w", key, value, n.Name, err)
		}
		return nil
	})
}

// Close removes the namespace and every interface in it.
func (n *NS) Close() error {
	if n.handle.IsOpen() {
		n.handle.Close()
	}
	_, err := ip("netns", "del", n.Name)
	return err
}

// IP runs ip(8) inside the namespace (ip -n NAME args...).
func (n *NS) IP(args ...string) (string, error) {
	return ip(append([]string{"-n", n.Name}, args...)...)
}

// Do runs f on an OS thread switched into the namespace. Sockets and BPF
// links made by f belong to the namespace and keep working from any thread
// afterwards. If the thread cannot be switched back it is not returned to
// the scheduler (it exits with the goroutine), so no other goroutine ever
// runs in the wrong namespace.
func (n *NS) Do(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(n.handle); err != nil {
			done <- fmt.Errorf("netnstest: enter %s: %w", n.Name, err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			done <- errors.Join(ferr, err)
			return // thread stays locked and dies
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// Link is one end of a veth pair.
type Link struct {
	NS      *NS
	Name    string
	Index   int
	MAC     net.HardwareAddr
	Addr    netip.Addr // IPv4 address, /24
	Addr6   netip.Addr // IPv6 address, /64
	Netmask int
}

// SetThreadedNAPI turns threaded NAPI on or off for the link's device
// (/sys/class/net/NAME/threaded, through ip netns exec, which mounts the
// namespace's own sysfs). A veth has NAPI only while an XDP program is
// attached to it, so call it after attaching one. Threaded, a veth's
// receive work runs in a kernel thread the scheduler can put on another
// CPU, instead of inside the peer's sendto(2).
func (l *Link) SetThreadedNAPI(on bool) error {
	v := "0"
	if on {
		v = "1"
	}
	_, err := l.sysfs("echo " + v + " > /sys/class/net/" + l.Name + "/threaded")
	return err
}

// ThreadedNAPI reports whether the link's device has threaded NAPI on.
func (l *Link) ThreadedNAPI() (bool, error) {
	out, err := l.sysfs("cat /sys/class/net/" + l.Name + "/threaded")
	return strings.TrimSpace(out) != "0", err
}

// sysfs runs a shell command inside the link's namespace with the
// namespace's own sysfs mounted (ip netns exec).
func (l *Link) sysfs(cmd string) (string, error) {
	return ip("netns", "exec", l.NS.Name, "sh", "-c", cmd)
}

// Pair is two namespaces joined by a veth pair.
type Pair struct {
	A, B Link
}

// Close removes both namespaces.
func (p *Pair) Close() error {
	return errors.Join(p.A.NS.Close(), p.B.NS.Close())
}

// PairOptions tune NewPair.
type PairOptions struct {
	MTU int // 0: the default 1500
	// Queues is the number of transmit and receive queues of each veth end
	// (0: one), for multi-queue tests.
	Queues int
	// Subnet is the third octet of 10.x.y.0/24 and fd00:x:y::/64; 0 picks
	// one from the pid. Each pair lives in its own namespaces, so equal
	// subnets in different pairs never meet.
	Subnet int
}

// NewPair makes two namespaces joined by a veth pair, with IPv4 and IPv6
// addresses, both ends up. The caller must Close it.
func NewPair(opt PairOptions) (p *Pair, err error) {
	a, err := Create("a")
	if err != nil {
		return nil, err
	}
	b, err := Create("b")
	if err != nil {
		return nil, errors.Join(err, a.Close())
	}
	p = &Pair{A: Link{NS: a, Name: Unique("va")}, B: Link{NS: b, Name: Unique("vb")}}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.Close())
			p = nil
		}
	}()
	var q []string
	if opt.Queues > 1 {
		q = []string{"numtxqueues", fmt.Sprint(opt.Queues), "numrxqueues", fmt.Sprint(opt.Queues)}
	}
	args := append([]string{"link", "add", p.A.Name}, q...)
	args = append(args, "netns", a.Name, "type", "veth", "peer", "name", p.B.Name)
	args = append(args, q...)
	args = append(args, "netns", b.Name)
	if _, err := ip(args...); err != nil {
		return p, err
	}
	sub := opt.Subnet
	if sub == 0 {
		sub = os.Getpid()%200 + 20
	}
	for i, l := range []*Link{&p.A, &p.B} {
		l.Addr = netip.MustParseAddr(fmt.Sprintf("10.99.%d.%d", sub, i+1))
		l.Addr6 = netip.MustParseAddr(fmt.Sprintf("fd00:99:%x::%d", sub, i+1))
		l.Netmask = 24
		if opt.MTU != 0 {
			if _, err := l.NS.IP("link", "set", l.Name, "mtu", fmt.Sprint(opt.MTU)); err != nil {
				return p, err
			}
		}
		if _, err := l.NS.IP("addr", "add", l.Addr.String()+"/24", "dev", l.Name); err != nil {
			return p, err
		}
		if _, err := l.NS.IP("addr", "add", l.Addr6.String()+"/64", "dev", l.Name, "nodad"); err != nil {
			return p, err
		}
		if _, err := l.NS.IP("link", "set", l.Name, "up"); err != nil {
			return p, err
		}
		if err := l.NS.Do(func() error {
			ifc, err := net.InterfaceByName(l.Name)
			if err != nil {
				return err
			}
			l.Index, l.MAC = ifc.Index, ifc.HardwareAddr
			return nil
		}); err != nil {
			return p, err
		}
	}
	return p, nil
}

// SkipUnlessRoot skips tb unless the process is root (namespaces, veth, XDP
// and AF_XDP need CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_BPF).
func SkipUnlessRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates network namespaces, veth pairs and XDP programs")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("needs iproute2's ip(8)")
	}
}

// NewTestPair is NewPair for a test: it skips when not root and removes the
// namespaces in a Cleanup, which runs even when the test fails.
func NewTestPair(tb testing.TB, opt PairOptions) *Pair {
	tb.Helper()
	SkipUnlessRoot(tb)
	p, err := NewPair(opt)
	if err != nil {
		tb.Fatalf("netnstest: %v", err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Errorf("netnstest: cleanup: %v", err)
		}
	})
	return p
}

// NewTestNS makes one namespace for a test, removed in a Cleanup.
func NewTestNS(tb testing.TB) *NS {
	tb.Helper()
	SkipUnlessRoot(tb)
	n, err := Create("srnt")
	if err != nil {
		tb.Fatalf("netnstest: %v", err)
	}
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Errorf("netnstest: cleanup: %v", err)
		}
	})
	return n
}

// Open opens the handle of an existing namespace known by Name (for a child
// process that was given the name).
func (n *NS) Open() error {
	h, err := netns.GetFromName(n.Name)
	if err != nil {
		return fmt.Errorf("netnstest: open %s: %w", n.Name, err)
	}
	n.handle = h
	return nil
}

// Live lists the namespaces this process made that still exist, for a test
// to check that everything it made was removed.
func Live() ([]string, error) {
	ents, err := os.ReadDir("/run/netns")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var mine []string
	prefix := fmt.Sprintf("%s%d-", nsPrefix, os.Getpid())
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			mine = append(mine, e.Name())
		}
	}
	return mine, nil
}
