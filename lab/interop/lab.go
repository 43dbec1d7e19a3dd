package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/softrnic/softrnic/internal/perftest"
)

// Addresses inside the lab's namespace: traffic never leaves it.
const (
	hostIP4 = "10.77.0.254"
	hostIP6 = "fd77::fe"
)

// tapQueueLen is the guest tap's txqueuelen in interop mode (see newLab).
const tapQueueLen = 16384

// A Lab is one run's namespace, taps and guests.
type Lab struct {
	o        options
	mode     string
	ns       string
	guests   []*Guest
	byPeer   map[string]*Guest
	hostIf   string // interop: the veth end softrnic attaches to
	capIf    string // where captures are taken
	hostMTU  int
	softPath string // directory whose "softrnic" is the -softrnic binary
	clib     string // the drop-in libraries softrnic-stock runs stock programs with
	closed   sync.Once

	mu      sync.Mutex
	running map[interface{ stop() }]bool // host jobs and captures to end on Close
}

func (l *Lab) track(p interface{ stop() }) {
	l.mu.Lock()
	if l.running == nil {
		l.running = map[interface{ stop() }]bool{}
	}
	l.running[p] = true
	l.mu.Unlock()
}

func (l *Lab) untrack(p interface{ stop() }) {
	l.mu.Lock()
	delete(l.running, p)
	l.mu.Unlock()
}

func newLab(o options, mode string) (*Lab, error) {
	var rnd [3]byte
	rand.Read(rnd[:])
	l := &Lab{o: o, mode: mode, byPeer: map[string]*Guest{},
		ns: fmt.Sprintf("srlab-%d-%s", os.Getpid(), hex.EncodeToString(rnd[:]))}
	if err := ipCmd("netns", "add", l.ns); err != nil {
		return nil, err
	}
	if err := l.setup(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Lab) setup() error {
	if err := nsExec(l.ns, "ip", "link", "set", "lo", "up"); err != nil {
		return err
	}
	// A namespace holding addresses on a bridge and another port must not
	// answer ARP for one on the other (weak host model, lab notes pitfall 6).
	if err := nsExec(l.ns, "sysctl", "-qw", "net.ipv4.conf.all.arp_ignore=1"); err != nil {
		return err
	}
	mkGuest := func(peer string, i int) *Guest {
		g := &Guest{
			Name:  peer,
			Share: mustMkdir(filepath.Join(l.o.out, "guest-"+peer)),
			IP4:   fmt.Sprintf("10.77.0.%d", i+1),
			IP6:   fmt.Sprintf("fd77::%d", i+1),
			MAC:   fmt.Sprintf("52:54:00:77:00:%02x", i+1),
			Tap:   fmt.Sprintf("lt%d", i),
		}
		l.guests = append(l.guests, g)
		l.byPeer[peer] = g
		return g
	}
	tap := func(name string) error {
		return ipCmd("-n", l.ns, "tuntap", "add", "dev", name, "mode", "tap")
	}
	if l.mode == "selfcheck" {
		a, b := mkGuest("a", 0), mkGuest("b", 1)
		if err := ipCmd("-n", l.ns, "link", "add", "lb0", "mtu", "4200", "type", "bridge"); err != nil {
			return err
		}
		for _, g := range []*Guest{a, b} {
			if err := tap(g.Tap); err != nil {
				return err
			}
			if err := ipCmd("-n", l.ns, "link", "set", g.Tap, "mtu", "4200", "master", "lb0", "up"); err != nil {
				return err
			}
		}
		// No STP, no forwarding delay: ports forward at once.
		if err := ipCmd("-n", l.ns, "link", "set", "lb0", "type", "bridge", "stp_state", "0", "forward_delay", "0"); err != nil {
			return err
		}
		if err := ipCmd("-n", l.ns, "link", "set", "lb0", "up"); err != nil {
			return err
		}
		l.capIf = "lb0"
		return nil
	}
	// Interop: guest tap lt0 and veth end lv1 on bridge lb0; softrnic
	// attaches (XDP/AF_XDP) to the other veth end, lv0, which holds the host
	// side's addresses. The bridge in the middle is where captures see every
	// frame both ways: on lv0 itself, frames XDP redirects to AF_XDP never
	// reach the packet taps tcpdump reads.
	g := mkGuest("guest", 0)
	if err := tap(g.Tap); err != nil {
		return err
	}
	l.hostIf, l.capIf, l.hostMTU = "lv0", "lb0", 1500
	for _, a := range [][]string{
		{"-n", l.ns, "link", "add", "lb0", "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"-n", l.ns, "link", "add", "lv0", "type", "veth", "peer", "name", "lv1"},
		// lv0 keeps its link-local address: without one the kernel's
		// neighbour discovery never resolves (an NTF_USE entry stays
		// INCOMPLETE, checked on this kernel). softrnic lists GIDs as IPv4,
		// global IPv6, then link-local, so hostIP6 is index 1 all the same.
		// The tap is the lab's only queue in front of the guest: tun drops
		// (tx_dropped) what does not fit its ring of txqueuelen frames while
		// qemu under TCG drains a few thousand frames a second. softrnic's
		// bursts (a 1 MiB READ reply is 1024 frames, -q 4 windows more)
		// overflowed the default 1000 and the guest saw loss no case asked
		// for; RoCE assumes a fabric that does not drop (PFC), so the clean
		// cases get a deep queue and the loss cases their own drops.
		{"-n", l.ns, "link", "set", g.Tap, "txqueuelen", strconv.Itoa(tapQueueLen)},
		{"-n", l.ns, "link", "set", g.Tap, "master", "lb0", "up"},
		{"-n", l.ns, "link", "set", "lv1", "master", "lb0", "up"},
		{"-n", l.ns, "link", "set", "lb0", "up"},
		{"-n", l.ns, "link", "set", "lv0", "up"},
		{"-n", l.ns, "addr", "add", hostIP4 + "/24", "dev", "lv0"},
		{"-n", l.ns, "-6", "addr", "add", hostIP6 + "/64", "dev", "lv0", "nodad"},
	} {
		if err := ipCmd(a...); err != nil {
			return err
		}
	}
	if err := l.setHostMTU(1500); err != nil {
		return err
	}
	// Host commands say "softrnic": a directory of the run's own, first in
	// their PATH, holds that name for the -softrnic binary whatever its file
	// is called (the binary's own directory may hold another "softrnic").
	bin, err := filepath.Abs(l.o.softrnic)
	if err != nil {
		return err
	}
	l.softPath = mustMkdir(filepath.Join(l.o.out, "bin"))
	link := filepath.Join(l.softPath, "softrnic")
	if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Symlink(bin, link); err != nil {
		return err
	}
	// Stock programs run through softrnic on the host by softrnic-stock,
	// which starts a daemon of their own on lv0 (c/build/lib's libraries).
	stock, err := filepath.Abs(filepath.Join("lab", "interop", "softrnic-stock"))
	if err != nil {
		return err
	}
	if l.clib, err = filepath.Abs(l.o.clib); err != nil {
		return err
	}
	link = filepath.Join(l.softPath, "softrnic-stock")
	if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.Symlink(stock, link)
}

// setHostMTU gives the host side of the interop path (veth pair, bridge
// port, tap) the case's netdev MTU, as the guest's eth0 gets it: softrnic
// derives its path MTU from lv0's.
func (l *Lab) setHostMTU(mtu int) error {
	for _, dev := range []string{"lt0", "lv1", "lv0", "lb0"} {
		if err := ipCmd("-n", l.ns, "link", "set", dev, "mtu", strconv.Itoa(mtu)); err != nil {
			return err
		}
	}
	l.hostMTU = mtu
	return nil
}

// Boot starts every guest (in parallel: each is one TCG thread) and waits
// for all of them.
func (l *Lab) Boot() error {
	kernel, _ := filepath.Abs(filepath.Join(l.o.cache, "vmlinuz"))
	initrd, _ := filepath.Abs(filepath.Join(l.o.cache, "initrd.img"))
	errs := make(chan error, len(l.guests))
	for _, g := range l.guests {
		go func(g *Guest) { errs <- g.Boot(l.ns, kernel, initrd, 1500, l.o.bootLimit) }(g)
	}
	var first error
	for range l.guests {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	return l.warmUp()
}

// warmUp has every guest ping every other address of the lab, IPv4 and
// IPv6, before the first case. rxe sends its first frames while ARP/ND is
// still resolving and the neighbour queue drops what does not fit, which
// would show up as retries in the first case of each family; it also proves
// the lab's wiring before any case depends on it.
func (l *Lab) warmUp() error {
	var targets []string
	if l.hostIf != "" {
		targets = append(targets, hostIP4, hostIP6)
	}
	for _, g := range l.guests {
		targets = append(targets, g.IP4, g.IP6)
	}
	c := &Case{Name: "lab warm-up", MTU: 1024, IP: 4, Timeout: 30 * time.Second}
	jobs := map[*Guest]*GuestJob{}
	for _, g := range l.guests {
		var cmd []string
		for _, t := range targets {
			if t != g.IP4 && t != g.IP6 {
				cmd = append(cmd, "ping -q -c 1 -W 5 "+t)
			}
		}
		j, err := g.Submit(c, "set -e\n"+strings.Join(cmd, "\n"), "")
		if err != nil {
			return err
		}
		jobs[g] = j
	}
	for g, j := range jobs {
		rc, err := j.Wait()
		if err != nil {
			return err
		}
		if rc != 0 {
			return fmt.Errorf("guest %s cannot reach the lab's addresses: %s", g.Name, strings.Join(tail("", j.Output(), 4), " / "))
		}
	}
	return nil
}

// Close powers the guests off and removes the namespace (and with it the
// taps and the bridge). Safe to call more than once.
func (l *Lab) Close() {
	l.closed.Do(func() {
		// Processes still inside the namespace keep it alive after its name
		// is gone: end them first.
		l.mu.Lock()
		for p := range l.running {
			p.stop()
		}
		l.mu.Unlock()
		var wg sync.WaitGroup
		for _, g := range l.guests {
			wg.Add(1)
			go func(g *Guest) { defer wg.Done(); g.Shutdown(15 * time.Second) }(g)
		}
		wg.Wait()
		if err := ipCmd("netns", "del", l.ns); err != nil {
			fmt.Fprintln(os.Stderr, "interop: teardown:", err)
		}
	})
}

// addr returns a peer's address in the family asked for.
func (l *Lab) addr(peer string, ip int) string {
	if g, ok := l.byPeer[peer]; ok {
		if ip == 6 {
			return g.IP6
		}
		return g.IP4
	}
	if ip == 6 {
		return hostIP6
	}
	return hostIP4
}

// expand fills a command's placeholders: {server} and {server6} (the
// server's addresses: side channels use IPv4), {server_ip} (the server's
// address in the case's GID family: what rdma_cm resolves), {iface} (the
// host's interface), {mtu} (path MTU).
func (l *Lab) expand(c *Case, cmd string) string {
	return strings.NewReplacer(
		"{server}", l.addr(c.Server.Peer, 4),
		"{server6}", l.addr(c.Server.Peer, 6),
		"{server_ip}", l.addr(c.Server.Peer, c.IP),
		"{iface}", l.hostIf,
		"{mtu}", strconv.Itoa(c.MTU),
	).Replace(cmd)
}

// job is one side of a case, in a guest or on the host.
type job interface {
	WaitReady() error
	Wait() (int, error)
	Output() string
}

type result struct {
	ok     bool
	fatal  bool // the lab itself broke (a guest died): stop the run
	took   time.Duration
	why    []string
	detail []string
	note   string
	// tapDrops counts the frames the lab's path (the guest's tap, the
	// bridge's veth end) dropped during the case, mostly the tap's queue
	// towards qemu: the lab's own loss, the evidence that decides whether
	// a failure may be retried (see Case.Retries).
	tapDrops uint64
	// hostDrops counts frames towards softrnic that lv0 dropped: its XDP
	// program dropped them (a damaged frame in the corruption cases) or
	// softrnic's AF_XDP socket had no room. Reported, never a reason to
	// retry: it is softrnic's side.
	hostDrops uint64
	// perftestRace: the client is a stock perftest -R that lost perftest's
	// own second-connect race (perftest.StockSecondConnectRace), a reason
	// to run the case again whatever its retries= says.
	perftestRace bool
}

func (l *Lab) start(c *Case, s Side, ready string, caseDir string) (job, error) {
	cmd := l.expand(c, s.Cmd)
	if g, ok := l.byPeer[s.Peer]; ok {
		return g.Submit(c, cmd, ready)
	}
	// HOSTGID is softrnic's GID index for the case's family: its table
	// lists the interface's IPv4 address first, then its IPv6 addresses.
	hostGID := "0"
	if c.IP == 6 {
		hostGID = "1"
	}
	env := append(os.Environ(), "PATH="+l.softPath+":"+os.Getenv("PATH"), "IFACE="+l.hostIf, "HOSTGID="+hostGID,
		"SOFTRNIC_COUNTERS="+filepath.Join(caseDir, countersFile), "SOFTRNIC_CLIB="+l.clib)
	j, err := startHost(l.ns, filepath.Join(caseDir, "host.out"), cmd, env, c, ready)
	if err == nil {
		l.track(j)
		go func() { <-j.done; l.untrack(j) }()
	}
	return j, err
}

// countersFile is where a case's softrnic hosts write their counters on
// exit ($SOFTRNIC_COUNTERS, in the case's directory).
const countersFile = "softrnic.counters"

// softrnicRetransmitted is what the case's softrnic hosts say they
// retransmitted (request packets sent more than once), and whether any
// said anything.
func (l *Lab) softrnicRetransmitted(caseDir string, fail func(string, ...any)) (uint64, bool) {
	f, err := os.Open(filepath.Join(caseDir, countersFile))
	if err != nil {
		return 0, false
	}
	defer func() { _ = f.Close() }() // read only
	n, ok, err := ReadRetransmitted(f)
	if err != nil {
		fail("%v", err)
	}
	return n, ok
}

// Run runs one case: server, wait until it is ready, client, wait for both,
// then judge exit statuses, the rxe counters of every guest involved, and
// the capture.
func (l *Lab) Run(c *Case) (r result) {
	t0 := time.Now()
	defer func() { r.took = time.Since(t0) }()
	fail := func(format string, a ...any) { r.why = append(r.why, fmt.Sprintf(format, a...)) }
	caseDir := mustMkdir(filepath.Join(l.o.out, "case", fileName(c.Name)))
	if err := os.Remove(filepath.Join(caseDir, countersFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		fail("%v", err) // a retry's hosts must write afresh
	}

	if l.hostIf != "" && c.NetdevMTU() != l.hostMTU {
		if err := l.setHostMTU(c.NetdevMTU()); err != nil {
			fail("%v", err)
			return r
		}
	}
	var capture *Capture
	if l.o.capture {
		var err error
		capture, err = startCapture(l.ns, l.capIf, filepath.Join(mustMkdir(filepath.Join(l.o.out, "pcap")), fileName(c.Name)+".pcap"))
		if err != nil {
			fail("capture: %v", err)
			return r
		}
		l.track(capture)
	}
	if l.hostIf != "" && c.Loss+c.Corrupt > 0 {
		if err := l.impairHost(c); err != nil {
			fail("impair: %v", err)
			if capture != nil {
				capture.Stop()
				l.untrack(capture)
			}
			return r
		}
		defer func() {
			// Left in place, it would impair the cases after this one.
			if err := nsExec(l.ns, "nft", "delete", "table", "netdev", "labimpair"); err != nil {
				fail("removing the impairment: %v", err)
				r.ok = false
			}
		}()
	}
	// Frames the tap dropped towards the guest during the case: loss the
	// lab made, not the case (see tapQueueLen).
	path0, pathErr := l.pathDrops()
	xsk0, xskErr := l.linkDrops(l.hostIf, "rx")
	defer func() {
		if d1, err := l.pathDrops(); pathErr == nil && err == nil && d1 > path0 {
			r.tapDrops = d1 - path0
		}
		if d1, err := l.linkDrops(l.hostIf, "rx"); xskErr == nil && err == nil && d1 > xsk0 {
			r.hostDrops = d1 - xsk0
		}
	}()
	ready := c.Ready
	if ready == "" {
		ready = "delay:1"
	}
	srv, err := l.start(c, c.Server, ready, caseDir)
	if err != nil {
		fail("server: %v", err)
		if capture != nil {
			capture.Stop()
			l.untrack(capture)
		}
		return r
	}
	var cli job
	if err := srv.WaitReady(); err != nil {
		fail("server: %v", err)
	} else if cli, err = l.start(c, c.Client, "", caseDir); err != nil {
		fail("client: %v", err)
	}
	// A client whose server already failed may wait for it forever: stop
	// it soon (and the other way round below).
	if cli != nil {
		go func() {
			if rc, _ := srv.Wait(); rc != 0 {
				l.stopSoon(cli, 5*time.Second)
			}
		}()
	}
	crc := -1
	if cli != nil {
		if crc, err = cli.Wait(); err != nil {
			fail("client: %v", err)
		}
	}
	if crc != 0 {
		l.stopSoon(srv, 5*time.Second)
	}
	src, err := srv.Wait()
	if err != nil {
		fail("server: %v", err)
	}
	if capture != nil {
		capture.Stop()
		l.untrack(capture)
	}
	status := func(rc int) string {
		if rc == 124 { // timeout(1)'s status, and what our host side mimics
			return fmt.Sprintf("timed out after %v", c.Timeout)
		}
		return fmt.Sprintf("exit %d", rc)
	}
	if cli != nil && crc != 0 {
		fail("client (%s) %s", c.Client.Peer, status(crc))
		r.perftestRace = perftest.StockSecondConnectRace([]byte(cli.Output()))
		r.detail = append(r.detail, tail("client: ", cli.Output(), 6)...)
	}
	if src != 0 {
		fail("server (%s) %s", c.Server.Peer, status(src))
		r.detail = append(r.detail, tail("server: ", srv.Output(), 6)...)
	}

	// The rxe side of the story: counters and kernel log of every guest,
	// less the duplicates softrnic's own retransmissions explain.
	var recovery, explained uint64
	budget, haveSoft := l.softrnicRetransmitted(caseDir, fail)
	var counts []string
	for _, jb := range []job{srv, cli} {
		gj, ok := jb.(*GuestJob)
		if !ok || gj == nil {
			continue
		}
		d, dm, err := gj.Counters()
		if err != nil {
			fail("guest %s counters: %v", gj.g.Name, err)
			continue
		}
		counts = append(counts, gj.g.Name+": "+d.String())
		if c.Expect != "loss" {
			explained += ExplainDuplicates(d, &budget)
		}
		probs, rec := CheckCounters(d, dm, c.Expect == "loss", c.Allow)
		if rec > 0 && c.Expect != "loss" && len(probs) == 0 {
			r.note = fmt.Sprintf("  (allowed: %s)", d.String())
		}
		recovery += rec
		for _, p := range probs {
			if strings.HasPrefix(p, "duplicate_request+") && haveSoft {
				p += fmt.Sprintf(" beyond the %d softrnic retransmitted", explained)
			}
			fail("guest %s: %s", gj.g.Name, p)
		}
	}
	if explained > 0 {
		r.note += fmt.Sprintf("  (duplicates explained: %d, all retransmitted by softrnic)", explained)
	}
	if err := os.WriteFile(filepath.Join(caseDir, "counters"), []byte(strings.Join(counts, "\n")+"\n"), 0o644); err != nil {
		fail("%v", err)
	}
	if c.Expect == "loss" {
		if recovery == 0 {
			fail("loss %d%%, corruption %d%%, but no NAK, retry or duplicate in the rxe counters: recovery not exercised", c.Loss, c.Corrupt)
		} else {
			r.note = fmt.Sprintf("  (recovered: %d NAK/retry/duplicate events)", recovery)
		}
	}
	// A case corrupting frames on purpose and expecting recovery has bad
	// ICRCs in its capture by design: its check would only re-find ours.
	if capture != nil && l.o.pcapCheck != "" && (c.Corrupt == 0 || c.Expect == "detect") {
		// rxe (6.1) drops a frame with a bad ICRC without a counter or a
		// log line; only the capture shows which frames were bad.
		cmd := strings.ReplaceAll(l.o.pcapCheck, "{}", capture.Path)
		out, err := exec.Command("bash", "-c", cmd).CombinedOutput()
		if werr := os.WriteFile(filepath.Join(caseDir, "pcapcheck"), out, 0o644); werr != nil {
			fail("%v", werr)
		}
		if err != nil {
			fail("pcap check: %v", err)
			r.detail = append(r.detail, tail("pcapcheck: ", string(out), 3)...)
		}
	}
	for _, g := range l.guests {
		if !g.Alive() {
			r.fatal = true
			fail("guest %s died (see %s)", g.Name, filepath.Join(g.Share, "console.log"))
		}
	}
	if c.Expect == "detect" && !r.fatal {
		// A negative test of the lab: the checks must have caught the damage.
		if len(r.why) == 0 {
			r.why = []string{fmt.Sprintf("%d%% of frames corrupted and no check noticed", c.Corrupt)}
		} else {
			r.note = "  (detected: " + strings.Join(r.why, "; ") + ")"
			r.why, r.detail = nil, nil
		}
	}
	r.ok = len(r.why) == 0
	if capture != nil && r.ok && !l.o.keepPcaps {
		// Checked and clean: only failures keep theirs (one left behind
		// costs disk only).
		_ = os.Remove(capture.Path)
	}
	return r
}

// impairHost applies a case's loss and corruption to the frames softrnic
// sends towards the guest, as netem does in the guest for the other
// direction: an nftables rule on the ingress of lv1, the bridge's side of
// softrnic's veth (after softrnic's own XDP hook on lv0, which only sees what
// the guest sends). Without it, a case where the guest mostly sends ACKs
// would lose too few frames to exercise any recovery. Corruption overwrites
// the first byte after the BTH (UDP checksum is 0 on RoCEv2, so only the
// ICRC can tell).
func (l *Lab) impairHost(c *Case) error {
	var b strings.Builder
	b.WriteString("table netdev labimpair {\n  chain toguest {\n    type filter hook ingress device \"lv1\" priority 0;\n")
	if c.Loss > 0 {
		fmt.Fprintf(&b, "    udp dport 4791 numgen random mod 100 < %d drop\n", c.Loss)
	}
	if c.Corrupt > 0 {
		// @th,160,8: transport header + 20 bytes = UDP (8) + BTH (12).
		fmt.Fprintf(&b, "    udp dport 4791 numgen random mod 100 < %d @th,160,8 set 0x5a\n", c.Corrupt)
	}
	b.WriteString("  }\n}\n")
	cmd := exec.Command("ip", "netns", "exec", l.ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// stopSoon ends a job after grace unless it ends by itself first.
func (l *Lab) stopSoon(j job, grace time.Duration) {
	go func() {
		time.Sleep(grace)
		switch j := j.(type) {
		case *GuestJob:
			if _, err := os.Stat(filepath.Join(j.dir, "rc")); err != nil {
				_ = os.WriteFile(filepath.Join(j.dir, "kill"), nil, 0o644) // best effort: the case's own limit kills it too
			}
		case *HostJob:
			select {
			case <-j.done:
			default:
				j.Kill()
			}
		}
	}()
}

// tail returns the last n non-empty lines of s, prefixed.
func tail(prefix, s string, n int) []string {
	var ls []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if strings.TrimSpace(l) != "" {
			ls = append(ls, prefix+l)
		}
	}
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return ls
}

// tapName is the guest's tap in interop mode, "" in the self-check (whose
// taps are not measured).
func (l *Lab) tapName() string {
	if l.hostIf == "" {
		return ""
	}
	return l.guests[0].Tap
}

// pathDrops sums the drops of the lab's own path between the guest and
// softrnic's veth end, both ways: the tap (tx: its ring towards qemu was
// full; rx: what qemu wrote could not be taken) and lv1 (tx: lv0's XDP
// ring of 256 frames was full because its NAPI did not run in time).
func (l *Lab) pathDrops() (uint64, error) {
	if l.hostIf == "" {
		return 0, nil
	}
	var sum uint64
	for _, d := range [][2]string{{l.tapName(), "tx"}, {l.tapName(), "rx"}, {"lv1", "tx"}, {"lv1", "rx"}} {
		n, err := l.linkDrops(d[0], d[1])
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// linkDrops reads one link's dropped counter in direction dir ("rx" or
// "tx"); 0 for no link.
func (l *Lab) linkDrops(dev, dir string) (uint64, error) {
	if dev == "" {
		return 0, nil
	}
	out, err := exec.Command("ip", "-n", l.ns, "-j", "-s", "link", "show", "dev", dev).Output()
	if err != nil {
		return 0, err
	}
	return parseDropped(out, dir)
}

// parseDropped takes stats64.DIR.dropped out of `ip -j -s link show` for
// one link.
func parseDropped(js []byte, dir string) (uint64, error) {
	type counts struct {
		Dropped uint64 `json:"dropped"`
	}
	var links []struct {
		Stats struct {
			RX counts `json:"rx"`
			TX counts `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(js, &links); err != nil {
		return 0, err
	}
	if len(links) != 1 {
		return 0, fmt.Errorf("ip link: %d links", len(links))
	}
	if dir == "rx" {
		return links[0].Stats.RX.Dropped, nil
	}
	return links[0].Stats.TX.Dropped, nil
}
