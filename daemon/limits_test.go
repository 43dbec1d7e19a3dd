package daemon

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The defaults follow the host: file descriptors from RLIMIT_NOFILE,
// mappings from vm.max_map_count with room kept for the daemon itself,
// bytes from memory; a uid gets less than the host, a connection less
// than its uid.
func TestDefaultLimitsFollowTheHost(t *testing.T) {
	small := DefaultLimits(Host{NoFile: 1024, MaxMapCount: 65530, Memory: 8 << 30})
	big := DefaultLimits(Host{NoFile: 1 << 20, MaxMapCount: 262144, Memory: 64 << 30})
	if small[FDs][PerHost] != 1024-reservedFDs || big[FDs][PerHost] != 1<<20-reservedFDs {
		t.Fatalf("fds per host %d, %d", small[FDs][PerHost], big[FDs][PerHost])
	}
	if small[Mappings][PerHost] != 65530-reservedMappings || big[Mappings][PerHost] != 262144-262144/16 {
		t.Fatalf("mappings per host %d, %d", small[Mappings][PerHost], big[Mappings][PerHost])
	}
	if big[QueueBytes][PerHost] != 8<<30 || big[MRBytes][PerUID] != 32<<30 {
		t.Fatalf("bytes %d %d", big[QueueBytes][PerHost], big[MRBytes][PerUID])
	}
	for _, l := range []Limits{small, big} {
		for r := Resource(0); r < NumResources; r++ {
			if r == Connections {
				continue
			}
			if !(l[r][PerConn] > 0 && l[r][PerConn] <= l[r][PerUID] && l[r][PerUID] <= l[r][PerHost]) {
				t.Errorf("%v: conn %d, uid %d, host %d", r, l[r][PerConn], l[r][PerUID], l[r][PerHost])
			}
		}
		// A connection's socket, doorbell and a CQ and QP fit a
		// connection's fds many times over.
		if l[FDs][PerConn] < 64 || l[Connections][PerUID] < 2 {
			t.Errorf("fds per connection %d, connections per uid %d", l[FDs][PerConn], l[Connections][PerUID])
		}
	}
	// 100 000 MRs on one host fit the defaults.
	if small[MRs][PerHost] < 100000 || small[MRs][PerConn] < 100000 {
		t.Errorf("MRs: %v", small[MRs])
	}
}

// A charge is taken at every scope or not at all, refused with the
// errno of its resource and scope, counted, and flagged for the log only
// the first time per connection and limit.
func TestAccounts(t *testing.T) {
	var l Limits
	for r := range l {
		l[r] = [NumScopes]int64{-1, -1, -1}
	}
	l[QPs] = [NumScopes]int64{PerConn: 2, PerUID: 3, PerHost: 4}
	l[FDs] = [NumScopes]int64{PerConn: 12, PerUID: -1, PerHost: 20}
	l[Connections] = [NumScopes]int64{PerConn: 1, PerUID: 2, PerHost: 3}
	a := newAccounts(l)
	a1, err := a.join(1)
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := a.join(1)
	if _, err := a.join(1); err == nil || err.Errno() != unix.EAGAIN || err.s != PerUID {
		t.Fatalf("third connection of uid 1: %v", err)
	}
	b, _ := a.join(2)
	if _, err := a.join(3); err == nil || err.s != PerHost {
		t.Fatalf("fourth connection: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := a1.take(charge{QPs, 1}); err != nil {
			t.Fatal(err)
		}
	}
	err = a1.take(charge{QPs, 1})
	if err == nil || err.s != PerConn || err.Errno() != unix.ENOMEM || !err.first {
		t.Fatalf("third QP of a connection: %+v", err)
	}
	if err := a1.take(charge{QPs, 1}); err == nil || err.first {
		t.Fatalf("second refusal: %+v", err)
	}
	if err := a2.take(charge{QPs, 1}); err != nil {
		t.Fatalf("first QP of a second connection: %v", err)
	}
	if err := a2.take(charge{QPs, 1}); err == nil || err.s != PerUID {
		t.Fatalf("fourth QP of a uid: %v", err)
	}
	if err := b.take(charge{QPs, 1}); err != nil {
		t.Fatalf("first QP of another uid: %v", err)
	}
	if err := b.take(charge{QPs, 1}); err == nil || err.s != PerHost {
		t.Fatalf("fifth QP of the host: %v", err)
	}
	// All or nothing: the QP fits, the fds do not.
	a1.give(charge{QPs, 1})
	if err := a1.take(charge{QPs, 1}, charge{FDs, 8}); err == nil || err.r != FDs || err.Errno() != unix.EMFILE {
		t.Fatalf("QP and 8 fds: %v", err)
	}
	if err := b.take(charge{FDs, 6}); err == nil || err.Errno() != unix.ENFILE {
		t.Fatalf("fds over the host's: %v", err)
	}
	if u := a.snapshot(); u.Host[QPs] != 3 || u.Refusals[QPs][PerConn] != 2 || u.Refusals[FDs][PerHost] != 1 {
		t.Fatalf("usage %v, refusals %v", u.Host, u.Refusals)
	}
	var le *limitError
	if !errors.As(error(a1.take(charge{QPs, 5})), &le) || !strings.Contains(le.Error(), "limits.qps-per-conn") {
		t.Fatalf("message names the key: %v", le)
	}
	for _, acc := range []*account{a1, a2, b} {
		acc.leave()
	}
	if u := a.snapshot(); u.Host != (usage{}) || len(a.uids) != 0 {
		t.Fatalf("left behind: %v, %d uids", u.Host, len(a.uids))
	}
}

func TestLimitKeys(t *testing.T) {
	c := DefaultConfig()
	conf := "interface = veth0\n[limits]\nqps-per-uid = 100\nmr-bytes-per-conn = 2GiB\nfds-per-host = unlimited\n"
	if err := c.ParseFile("t.conf", strings.NewReader(conf)); err != nil {
		t.Fatal(err)
	}
	if c.Limits[QPs][PerUID] != 100 || c.Limits[MRBytes][PerConn] != 2<<30 || c.Limits[FDs][PerHost] != -1 {
		t.Fatalf("limits %v", c.Limits)
	}
	for _, bad := range []string{"[limits]\nqps-per-uid = lots\n", "[limits]\nconnections-per-conn = 2\n", "[limits]\nobjects-per-host = 9\n"} {
		c := DefaultConfig()
		if err := c.ParseFile("t.conf", strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := RegisterFlags(fs)
	if err := fs.Parse([]string{"-d", "veth0", "--limits.cqs-per-conn", "7"}); err != nil {
		t.Fatal(err)
	}
	c, err := f.Load()
	if err != nil || c.Limits[CQs][PerConn] != 7 {
		t.Fatalf("flag: %v %v", c.Limits[CQs], err)
	}
	// The daemon fills the rest from the host.
	l := c.Limits.WithDefaults(DefaultLimits(ReadHost()))
	if l[CQs][PerConn] != 7 || l[QPs][PerUID] <= 0 || l[Connections][PerConn] != 1 {
		t.Fatalf("with defaults: %v", l)
	}
}
