package host

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"syscall"
)

// An interface has one RNIC at a time: the daemon serving it, or a tool
// running its own on it. Two would each steer the interface's RoCEv2 into
// sockets of their own and take each other's frames (a tool started beside
// a daemon hung for its whole timeout, and the daemon's stream ended in
// RETRY_EXC_ERR). Open therefore claims the interface, keyed by network
// namespace and name, with an flock(2) on a file in OwnerDir that holds
// who owns it; the kernel drops the claim when its owner exits, however
// it exits.

// OwnerDir is where the claims are (a variable for tests).
var OwnerDir = "/run/softrnic/owners"

// Owner says who opens a host, for the refusal another opener gets.
type Owner struct {
	// Name is the program, e.g. "softrnic perf" (default: this
	// executable's name).
	Name string
	// Control, for the daemon, is its control socket: a tool refused
	// because the daemon holds the interface is told to use it.
	Control string
}

// claim is a held claim on an interface.
type claim struct {
	f    *os.File
	path string
}

// claimInterface claims iface in the calling thread's network namespace
// for who, or says who holds it.
func claimInterface(iface string, who Owner) (*claim, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return nil, fmt.Errorf("host: network namespace: %w", err)
	}
	if err := os.MkdirAll(OwnerDir, 0o755); err != nil {
		return nil, fmt.Errorf("host: claiming %s: %w", iface, err)
	}
	path := filepath.Join(OwnerDir, fmt.Sprintf("netns%d-%s", st.Ino, iface))
	if who.Name == "" {
		who.Name = filepath.Base(os.Args[0])
		if len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "-") {
			who.Name += " " + os.Args[1] // softrnic perf
		}
	}
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("host: claiming %s: %w", iface, err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			b := make([]byte, 512)
			n, _ := f.ReadAt(b, 0)
			_ = f.Close() // read only; the lock is what to report
			if !errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("host: claiming %s: %w", iface, err)
			}
			return nil, refusal(iface, who, string(b[:n]))
		}
		// The previous owner may have removed the file between our open
		// and our lock: then the lock is on a name nobody else sees.
		var fst, pst syscall.Stat_t
		if syscall.Fstat(int(f.Fd()), &fst) != nil || syscall.Stat(path, &pst) != nil || fst.Ino != pst.Ino {
			_ = f.Close() // read only, unlocked
			continue
		}
		rec := fmt.Sprintf("pid=%d\nname=%s\ncontrol=%s\n", os.Getpid(), who.Name, who.Control)
		// The record only names the owner in the next opener's refusal.
		err = f.Truncate(0)
		if err == nil {
			_, err = f.WriteAt([]byte(rec), 0)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("host: claiming %s: %w", iface, err), f.Close())
		}
		return &claim{f: f, path: path}, nil
	}
}

// release gives the interface up. The file goes first, under the lock, so
// that the next opener never locks a name that is about to vanish.
func (c *claim) release() error {
	if c == nil {
		return nil
	}
	return errors.Join(os.Remove(c.path), c.f.Close())
}

// refusal is the error for an opener who finds iface claimed by the
// owner recorded in rec.
func refusal(iface string, who Owner, rec string) error {
	var pid, name, control string
	for _, l := range strings.Split(rec, "\n") {
		k, v, _ := strings.Cut(l, "=")
		switch k {
		case "pid":
			if _, err := strconv.Atoi(v); err == nil {
				pid = v
			}
		case "name":
			name = v
		case "control":
			control = v
		}
	}
	if name == "" {
		name = "another softrnic"
	}
	switch {
	case control != "" && who.Control == "":
		return fmt.Errorf("%s is served by the softrnic daemon (pid %s, control socket %s): run with --daemon %s to use it",
			iface, pid, control, control)
	case control != "":
		return fmt.Errorf("a softrnic daemon (pid %s, control socket %s) already serves %s", pid, control, iface)
	default:
		return fmt.Errorf("%s is in use by %s (pid %s), which runs its own RNIC on it", iface, name, pid)
	}
}
