package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
)

// The drop-in libibverbs.so.1 (c/): built once per test binary with the
// project's Makefile, plain and with AddressSanitizer.
var (
	clibOnce sync.Once
	clibDir  string // c/build, absolute
	clibErr  error
)

func buildCLib(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		t.Skip("libibverbs-dev is not installed (make deps)")
	}
	clibOnce.Do(func() {
		root, err := filepath.Abs(filepath.Join("..", ".."))
		if err != nil {
			clibErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "make", "-s", "-C", filepath.Join(root, "c")).CombinedOutput()
		if err != nil {
			clibErr = fmt.Errorf("make -C c: %w\n%s", err, out)
			return
		}
		clibDir = filepath.Join(root, "c", "build")
	})
	if clibErr != nil {
		t.Fatal(clibErr)
	}
	return clibDir
}

// stockLib is the path of rdma-core's library name (libibverbs.so.1,
// librdmacm.so.1).
func stockLib(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("gcc", "-print-file-name="+name).Output()
	p := strings.TrimSpace(string(out))
	if err != nil || !filepath.IsAbs(p) {
		t.Skip("rdma-core's " + name + " is not installed (make deps)")
	}
	p, err = filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// exports lists a library's dynamic symbols as "VERSION NAME TYPE" lines
// (VERSION in parentheses for a non-default version), sorted; imports,
// its undefined ones.
func exports(t *testing.T, lib string) []string { return dynsyms(t, lib, false) }
func imports(t *testing.T, lib string) []string { return dynsyms(t, lib, true) }

func dynsyms(t *testing.T, lib string, undefined bool) []string {
	t.Helper()
	out, err := exec.Command("objdump", "-T", lib).Output()
	if err != nil {
		t.Fatalf("objdump -T %s: %v", lib, err)
	}
	var syms []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 || strings.Contains(l, "*UND*") != undefined {
			continue
		}
		typ := "?"
		for _, x := range f[1 : len(f)-3] {
			if x == "DF" || x == "DO" {
				typ = x
			}
		}
		syms = append(syms, f[len(f)-2]+" "+f[len(f)-1]+" "+typ)
	}
	slices.Sort(syms)
	return syms
}

// privateNode is the version node of the interface between softrnic's two
// libraries (c/include/softrnic_private.h): the only exports beyond
// rdma-core's.
const privateNode = "SOFTRNIC_PRIVATE_1"

// Each library exports exactly rdma-core's symbols, each with its version
// node (default or compatibility) and kind: what BIND_NOW binaries and the
// stock providers need to load, and nothing more but libibverbs' private
// node, which librdmacm imports (so that it cannot load beside rdma-core's
// libibverbs).
func TestCLibExportsStockSymbols(t *testing.T) {
	dir := buildCLib(t)
	for _, l := range []struct {
		name string
		min  int // stock exports at least (functions and version nodes)
	}{{"libibverbs.so.1", 150}, {"librdmacm.so.1", 70}} {
		stock := exports(t, stockLib(t, l.name))
		for _, build := range []string{"lib", "asan/lib"} {
			ours := exports(t, filepath.Join(dir, build, l.name))
			var missing, extra []string
			for _, s := range stock {
				if !slices.Contains(ours, s) {
					missing = append(missing, s)
				}
			}
			for _, s := range ours {
				if !slices.Contains(stock, s) && !(l.name == "libibverbs.so.1" && strings.HasPrefix(s, privateNode+" ")) {
					extra = append(extra, s)
				}
			}
			if len(missing) > 0 || len(extra) > 0 || len(stock) < l.min {
				t.Errorf("%s/%s: %d stock exports; missing %v; extra %v", build, l.name, len(stock), missing, extra)
			}
		}
	}
	for _, build := range []string{"lib", "asan/lib"} {
		priv := 0
		for _, s := range imports(t, filepath.Join(dir, build, "librdmacm.so.1")) {
			if strings.HasPrefix(s, "("+privateNode+") ") {
				priv++
			}
		}
		if priv == 0 {
			t.Errorf("%s/librdmacm.so.1 imports nothing of %s", build, privateNode)
		}
	}
}

// The stock programs that link libibverbs (directly, or through librdmacm
// and the providers), with an argument that makes them print their usage
// and stop.
var stockPrograms = [][]string{
	{"ibv_devices", "--help"}, {"ibv_devinfo", "--help"}, {"ibv_asyncwatch", "--help"},
	{"ibv_rc_pingpong", "-h"}, {"ibv_uc_pingpong", "-h"}, {"ibv_ud_pingpong", "-h"},
	{"ibv_srq_pingpong", "-h"}, {"ibv_xsrq_pingpong", "-h"},
	{"ib_write_bw", "--help"}, {"ib_write_lat", "--help"}, {"ib_read_bw", "--help"}, {"ib_read_lat", "--help"},
	{"ib_send_bw", "--help"}, {"ib_send_lat", "--help"}, {"ib_atomic_bw", "--help"}, {"ib_atomic_lat", "--help"},
	{"rping", "-h"}, {"udaddy", "-h"}, {"mckey", "-h"}, {"ucmatose", "-h"}, {"cmtime", "-h"},
	{"rdma_client", "-h"}, {"rdma_server", "-h"}, {"rdma_xclient", "-h"}, {"rdma_xserver", "-h"},
	{"rstream", "-h"}, {"riostream", "-h"},
	// pyverbs loads libibverbs and librdmacm with its extension modules
	// (dlopen, RTLD_NOW) and says which ones it got.
	{"/usr/bin/python3", "-c", "import pyverbs.device, pyverbs.pd, pyverbs.cq, pyverbs.qp, pyverbs.cmid, pyverbs.providers.mlx5.mlx5dv; " +
		"print(*sorted(set(l.split()[-1] for l in open('/proc/self/maps') if 'libibverbs' in l or 'librdmacm' in l)), sep='\\n')"},
}

var loaderError = regexp.MustCompile(`error while loading shared libraries|symbol lookup error|undefined symbol|version .* not found|cannot open shared object`)

// Every stock program loads with the libraries (all Debian's binaries are
// BIND_NOW: one unresolved import would stop them), through softrnic run,
// and the libibverbs.so.1 and librdmacm.so.1 it maps are ours.
func TestStockProgramsLoad(t *testing.T) {
	dir := buildCLib(t)
	bin := buildSoftrnic(t)
	lib := filepath.Join(dir, "lib")
	ran, rdmacm := 0, 0
	for _, p := range stockPrograms {
		path, err := exec.LookPath(p[0])
		if err != nil {
			t.Logf("%s: not installed", p[0])
			continue
		}
		if strings.HasSuffix(p[0], "python3") {
			if err := exec.Command(path, "-c", "import pyverbs").Run(); err != nil {
				t.Logf("pyverbs: not installed")
				continue
			}
		}
		ran++
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin, append([]string{"run", "--lib", lib, "--control", "/nonexistent", "--"}, p...)...)
		cmd.Env = append(os.Environ(), "LD_BIND_NOW=1")
		out, _ := cmd.CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		if loaderError.Match(out) || timedOut {
			t.Errorf("%s: %s", strings.Join(p, " "), out)
			continue
		}
		// Which libraries the loader picks for the program: every
		// libibverbs.so.1 and librdmacm.so.1 it maps must be ours, and
		// it maps libibverbs.so.1.
		tout, err := out, error(nil)
		if !strings.HasSuffix(p[0], "python3") {
			tout, err = exec.Command(bin, "run", "--lib", lib, "--", "env", "LD_TRACE_LOADED_OBJECTS=1", path).Output()
		}
		if err != nil {
			t.Errorf("%s: %v", p[0], err)
			continue
		}
		for _, name := range libNames {
			ours := filepath.Join(lib, name)
			maps := regexp.MustCompile(`(?m)(\S*`+regexp.QuoteMeta(name)+`\S*)\s*$|`+regexp.QuoteMeta(name)+` => (\S+)`).FindAllSubmatch(tout, -1)
			if name == "libibverbs.so.1" && len(maps) == 0 {
				t.Errorf("%s does not map %s:\n%s", p[0], name, tout)
			}
			for _, m := range maps {
				if got := string(m[1]) + string(m[2]); got != ours {
					t.Errorf("%s maps %s, not ours (%s):\n%s", p[0], got, ours, tout)
				}
			}
			if name == "librdmacm.so.1" && len(maps) > 0 {
				rdmacm++
			}
		}
	}
	t.Logf("%d stock programs load and map our libraries, %d of them librdmacm.so.1 too", ran, rdmacm)
	if ran < 10 || rdmacm < 8 {
		t.Fatalf("only %d stock programs installed, %d of them rdma_cm users (make deps installs perftest, ibverbs-utils, rdmacm-utils)", ran, rdmacm)
	}
}

// softrnic run passes the program's exit status through and sets the
// environment the library reads.
func TestRunPassesStatusAndEnv(t *testing.T) {
	bin := buildSoftrnic(t)
	lib := t.TempDir()
	for _, name := range libNames {
		if err := os.WriteFile(filepath.Join(lib, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "run", "--lib", lib, "--control", "ctl.sock", "--", "sh", "-c", `echo "$LD_LIBRARY_PATH|$SOFTRNIC_CONTROL"; exit 7`)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH=/x", "SOFTRNIC_CONTROL=/old")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("exit: %v", err)
	}
	wd, _ := os.Getwd()
	if want := lib + ":/x|" + filepath.Join(wd, "ctl.sock") + "\n"; string(out) != want {
		t.Fatalf("environment %q, want %q", out, want)
	}
	if err := exec.Command(bin, "run", "--lib", t.TempDir(), "--", "true").Run(); err == nil {
		t.Fatal("a directory without the libraries was accepted")
	}
	// One library alone would be paired with rdma-core's other.
	half := t.TempDir()
	if err := os.WriteFile(filepath.Join(half, "libibverbs.so.1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "run", "--lib", half, "--", "true").CombinedOutput(); err == nil || !bytes.Contains(out, []byte("librdmacm.so.1")) {
		t.Fatalf("a directory without librdmacm.so.1 was accepted: %v %s", err, out)
	}
	// Installed as make install lays it out: PREFIX/bin/softrnic finds
	// PREFIX/lib/softrnic without --lib.
	prefix := t.TempDir()
	inst := filepath.Join(prefix, "bin", "softrnic")
	libdir := filepath.Join(prefix, "lib", "softrnic")
	b, err := os.ReadFile(bin)
	if err == nil {
		err = errors.Join(os.MkdirAll(filepath.Dir(inst), 0o755), os.MkdirAll(libdir, 0o755))
	}
	if err == nil {
		err = os.WriteFile(inst, b, 0o755)
	}
	for _, name := range libNames {
		if err == nil {
			err = os.WriteFile(filepath.Join(libdir, name), nil, 0o644)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(inst, "run", "--", "sh", "-c", `echo "$LD_LIBRARY_PATH"`)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "LD_LIBRARY_PATH=") })
	out, err = cmd.Output()
	if err != nil || string(out) != libdir+"\n" {
		t.Fatalf("installed layout: %q %v, want %s", out, err, libdir)
	}
}

// ibv_devices and ibv_devinfo -v, stock, through softrnic run against a
// daemon on a veth: the device named after the interface, the node GUID
// from its MAC, the port active on Ethernet with the daemon's path MTU,
// and the GID table (the interface's addresses, IPv4-mapped first) as
// RoCE v2 GIDs.
func TestStockDevinfoAgainstDaemon(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	dir := buildCLib(t)
	bin := buildSoftrnic(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sock, _ := startDaemon(t, bin, pair.A)
	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, append([]string{"run", "--lib", filepath.Join(dir, "lib"), "--control", sock, "--"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	name := "softrnic_" + pair.A.Name
	mac := pair.A.MAC
	guid := fmt.Sprintf("%02x%02x:%02xff:fe%02x:%02x%02x", mac[0]^2, mac[1], mac[2], mac[3], mac[4], mac[5])
	devices := run("ibv_devices")
	if !regexp.MustCompile(`(?m)^\s+` + name + `\s+` + strings.ReplaceAll(guid, ":", "") + `$`).MatchString(devices) {
		t.Errorf("ibv_devices:\n%s", devices)
	}
	info := run("ibv_devinfo", "-v", "-d", name)
	for _, want := range []string{
		`hca_id:\s+` + name,
		`node_guid:\s+` + guid,
		`phys_port_cnt:\s+1`,
		`state:\s+PORT_ACTIVE \(4\)`,
		`active_mtu:\s+1024 \(3\)`,
		`link_layer:\s+Ethernet`,
		`GID\[\s*0\]:\s+::ffff:` + regexp.QuoteMeta(pair.A.Addr.String()) + `, RoCE v2`,
		`GID\[\s*1\]:\s+\S+, RoCE v2`,
	} {
		if !regexp.MustCompile(want).MatchString(info) {
			t.Errorf("ibv_devinfo -v lacks %q:\n%s", want, info)
		}
	}
	if exec.Command("/usr/bin/python3", "-c", "import pyverbs").Run() != nil {
		t.Log("pyverbs: not installed")
		return
	}
	// pyverbs (rdma-core's Python binding, Cython over libibverbs).
	py := run("/usr/bin/python3", "-c", `
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.cq import CQ, CompChannel
from pyverbs.qp import QP, QPInitAttr, QPCap
import pyverbs.enums as e
ctx = Context(name='`+name+`')
port = ctx.query_port(1)
assert port.state == e.IBV_PORT_ACTIVE and port.link_layer == e.IBV_LINK_LAYER_ETHERNET
assert ctx.query_gid_type(1, 0) == e.IBV_GID_TYPE_SYSFS_ROCE_V2
gids = ctx.query_gid_table(16)
assert len(gids) == port.gid_tbl_len
pd = PD(ctx)
ch = CompChannel(ctx)
cq = CQ(ctx, 16, None, ch, 0)
qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(max_send_wr=4, max_recv_wr=4)))
print('pyverbs ok', ctx.query_device().phys_port_cnt, len(gids), qp.qp_num > 1)
`)
	if !strings.Contains(py, "pyverbs ok 1 ") || !strings.Contains(py, " True") {
		t.Errorf("pyverbs:\n%s", py)
	}
}

// The project's C test program, under AddressSanitizer, against daemons
// on a veth: every control verb and error path, then RC and UC traffic
// between two processes on two daemons through both post-send APIs, SRQs,
// solicited completion events and asynchronous events (port events with
// the link taken down and up, DEVICE_FATAL with the daemon stopped).
func TestCProgram(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	dir := buildCLib(t)
	bin := buildSoftrnic(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sockA, stopA := startDaemon(t, bin, pair.A)
	sockB, _ := startDaemon(t, bin, pair.B)
	test := filepath.Join(dir, "asan", "srn_test")
	lib := filepath.Join(dir, "asan", "lib")
	prog := func(ctx context.Context, ns *netnstest.NS, sock string, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.Name, bin, "run", "--lib", lib, "--control", sock, "--", test}, args...)...)
	}
	t.Run("control", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := prog(ctx, pair.A.NS, sockA, "control", pair.B.Addr.String()).CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte(" passed, 0 failed")) {
			t.Fatalf("%v\n%s", err, out)
		}
		t.Logf("%s", bytes.TrimSpace(out))
	})
	for _, m := range []struct{ name, server, client, port string }{
		{"traffic", "server", "client", "18515"},
		{"srq", "srq-server", "srq-client", "18516"},
	} {
		t.Run(m.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			var sout bytes.Buffer
			srv := prog(ctx, pair.B.NS, sockB, m.server, m.port)
			srv.Stdout, srv.Stderr = &sout, &sout
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			cout, cerr := prog(ctx, pair.A.NS, sockA, m.client, pair.B.Addr.String(), m.port).CombinedOutput()
			serr := srv.Wait()
			if cerr != nil || serr != nil || !bytes.Contains(cout, []byte(" passed, 0 failed")) || !bytes.Contains(sout.Bytes(), []byte(" passed, 0 failed")) {
				t.Fatalf("client: %v\n%s\nserver: %v\n%s", cerr, cout, serr, sout.String())
			}
			t.Logf("client: %s; server: %s", lastLine(cout), lastLine(sout.Bytes()))
		})
	}
	// The link of A's veth goes down with its peer's, and comes back.
	t.Run("port-events", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		link := func(state string) {
			if out, err := exec.Command("ip", "-n", pair.B.NS.Name, "link", "set", pair.B.Name, state).CombinedOutput(); err != nil {
				t.Fatalf("ip link set %s %s: %v %s", pair.B.Name, state, err, out)
			}
		}
		t.Cleanup(func() { link("up") })
		runSteps(t, prog(ctx, pair.A.NS, sockA, "port"), map[string]func(){"ready": func() { link("down") }, "down": func() { link("up") }})
	})
	// Last: it stops daemon A.
	t.Run("device-fatal", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		runAcrossStop(t, prog(ctx, pair.A.NS, sockA, "fatal"), stopA)
	})
}

// runSteps runs a C test program that prints lines naming the steps it
// waits for, runs each step's function when its line comes, and expects the
// program to pass.
func runSteps(t *testing.T, cmd *exec.Cmd, steps map[string]func()) {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var rest bytes.Buffer
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if f, ok := steps[sc.Text()]; ok {
			f()
			continue
		}
		rest.WriteString(sc.Text() + "\n")
	}
	if err := cmd.Wait(); err != nil || !bytes.Contains(rest.Bytes(), []byte(" passed, 0 failed")) {
		t.Fatalf("%v\n%s%s", err, rest.String(), stderr.String())
	}
	t.Logf("%s", bytes.TrimSpace(rest.Bytes()))
}

// runAcrossStop runs a C test program that prints "ready" once it waits
// for the daemon to go away, then stops the daemon and expects the program
// to pass.
func runAcrossStop(t *testing.T, cmd *exec.Cmd, stop func()) {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 6)
	if _, err := io.ReadFull(stdout, line); err != nil || string(line) != "ready\n" {
		cmd.Wait()
		t.Fatalf("%q %v\n%s", line, err, stderr.String())
	}
	stop()
	rest, _ := io.ReadAll(stdout)
	if err := cmd.Wait(); err != nil || !bytes.Contains(rest, []byte(" passed, 0 failed")) {
		t.Fatalf("%v\n%s%s", err, rest, stderr.String())
	}
	t.Logf("%s", bytes.TrimSpace(rest))
}

func lastLine(b []byte) string {
	l := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return string(l[len(l)-1])
}

// Stock ibv_asyncwatch through softrnic run prints the port's events as
// the link of the daemon's interface goes down and up, and
// DEVICE_FATAL when the daemon stops, after which it exits.
func TestStockAsyncwatch(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	dir := buildCLib(t)
	bin := buildSoftrnic(t)
	if _, err := exec.LookPath("ibv_asyncwatch"); err != nil {
		t.Skip("ibv_asyncwatch is not installed (make deps)")
	}
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sock, stop := startDaemon(t, bin, pair.A)
	link := func(state string) {
		if out, err := exec.Command("ip", "-n", pair.B.NS.Name, "link", "set", pair.B.Name, state).CombinedOutput(); err != nil {
			t.Fatalf("ip link set %s %s: %v %s", pair.B.Name, state, err, out)
		}
	}
	t.Cleanup(func() { link("up") })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", pair.A.NS.Name, bin, "run", "--lib", filepath.Join(dir, "lib"),
		"--control", sock, "--", "ibv_asyncwatch", "-d", "softrnic_"+pair.A.Name)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		line string
		then func()
	}{
		{`async event FD \d+`, func() { link("down") }},
		{`event_type IBV_EVENT_PORT_ERR \(10\), port 1`, func() { link("up") }},
		{`event_type IBV_EVENT_PORT_ACTIVE \(9\), port 1`, stop},
		{`event_type IBV_EVENT_DEVICE_FATAL \(8\)`, func() {}},
	}
	sc := bufio.NewScanner(out)
	var seen []string
	for _, s := range steps {
		re := regexp.MustCompile(s.line)
		found := false
		for !found && sc.Scan() {
			seen = append(seen, sc.Text())
			found = re.MatchString(sc.Text())
		}
		if !found {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no line %q:\n%s\n%s", s.line, strings.Join(seen, "\n"), stderr.String())
		}
		s.then()
	}
	// After DEVICE_FATAL, ibv_get_async_event fails and asyncwatch exits 1.
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("ibv_asyncwatch after DEVICE_FATAL: %v\n%s", err, stderr.String())
	}
	t.Logf("%s", strings.Join(seen, "; "))
}
