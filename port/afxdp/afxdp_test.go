package afxdp

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/port"
)

// openIn opens a port on l inside l's namespace.
func openIn(t *testing.T, l *netnstest.Link, cfg Config) *Port {
	t.Helper()
	cfg.IfIndex = l.Index
	var p *Port
	if err := l.NS.Do(func() (err error) {
		p, err = Open(cfg)
		return err
	}); err != nil {
		t.Fatalf("open AF_XDP port on %s: %v", l.Name, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestTransfer100k: 100 000 RoCEv2 frames of varied sizes from an AF_XDP
// port in one namespace to one in another arrive in order and byte-exact,
// while ping and TCP between the namespaces keep working.
func TestTransfer100k(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	a := openIn(t, &pair.A, Config{})
	b := openIn(t, &pair.B, Config{})
	st, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("mode: XDP %v, zero-copy %v, multi-buffer %v, MaxFrame %d", st.AttachMode, st.ZeroCopy, st.Multi, b.MaxFrame())
	if st.Multi {
		t.Errorf("multi-buffer on at MTU 1500")
	}

	if got, err := pair.A.NS.Ping(pair.B.Addr, 3, 5*time.Second); err != nil || got != 3 {
		t.Fatalf("ping with the program attached: %d/3 replies, %v", got, err)
	}
	if err := netnstest.TCPCheck(pair.A.NS, pair.B.NS, pair.B.Addr.String()); err != nil {
		t.Fatalf("TCP with the program attached: %v", err)
	}

	const n = 100000
	size := func(i int) int { return 60 + (i*37)%(1514-60+1) }
	res, err := netnstest.Transfer(a, b, &pair.A, &pair.B, n, size, 1024, 90*time.Second)
	t.Logf("%d frames in %v (%.0f frames/s)", res.Received, res.Elapsed, float64(res.Received)/res.Elapsed.Seconds())
	if err != nil {
		t.Fatal(err)
	}
	st, err = b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Program.Steered < n {
		t.Errorf("program steered %d, want at least %d", st.Program.Steered, n)
	}
	if st.Socket.RxDescs < n {
		t.Errorf("socket took %d descriptors, want at least %d", st.Socket.RxDescs, n)
	}
	t.Logf("receiver stats: %+v", st)

	// The kernel path still works after the burst.
	if got, err := pair.B.NS.Ping(pair.A.Addr, 2, 5*time.Second); err != nil || got != 2 {
		t.Fatalf("ping after the transfer: %d/2 replies, %v", got, err)
	}
}

// TestTransferUnderLoad is the data-path half of the loaded send_lat
// failures: with CPU hogs on every core and the garbage collector
// running all the time (GOGC=1 made those failures more frequent), frames
// sent both ways between two AF_XDP ports over veth must all arrive, byte
// for byte, and every one must have gone through the peer's XDP program
// (counted steered): veth hands a frame past native XDP to the stack only
// when the peer has no program attached, which a live port never allows.
func TestTransferUnderLoad(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	a := openIn(t, &pair.A, Config{})
	b := openIn(t, &pair.B, Config{})

	defer debug.SetGCPercent(debug.SetGCPercent(1))
	stop := make(chan struct{})
	var hogs sync.WaitGroup
	for i := 0; i < runtime.NumCPU(); i++ {
		hogs.Add(1)
		go func() {
			defer hogs.Done()
			runtime.LockOSThread()
			end := time.Now().Add(2 * time.Minute) // bounded even if the test hangs
			for time.Now().Before(end) {
				select {
				case <-stop:
					return
				default:
				}
				_ = make([]byte, 64) // keeps the collector busy
			}
		}()
	}
	defer hogs.Wait()
	defer close(stop)

	const n = 30000
	size := func(i int) int { return 60 + (i*53)%(1514-60+1) }
	for _, dir := range []struct {
		name     string
		tx, rx   *Port
		src, dst *netnstest.Link
	}{{"A to B", a, b, &pair.A, &pair.B}, {"B to A", b, a, &pair.B, &pair.A}} {
		before, err := dir.rx.Stats()
		if err != nil {
			t.Fatal(err)
		}
		res, err := netnstest.Transfer(dir.tx, dir.rx, dir.src, dir.dst, n, size, 256, 90*time.Second)
		t.Logf("%s: %d frames in %v", dir.name, res.Received, res.Elapsed)
		if err != nil {
			t.Fatalf("%s: %v", dir.name, err)
		}
		after, err := dir.rx.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if got := after.Program.Steered - before.Program.Steered; got != n {
			t.Errorf("%s: the receiver's XDP program steered %d frames, want %d", dir.name, got, n)
		}
	}
}

// TestMTU4096MultiBuffer: with a 4200-byte MTU the port turns multi-buffer
// on and carries RoCE path-MTU-4096 frames (4154 bytes over IPv4) intact.
func TestMTU4096MultiBuffer(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{MTU: 4200})
	a := openIn(t, &pair.A, Config{})
	b := openIn(t, &pair.B, Config{})
	if b.MaxFrame() < 4154 {
		t.Fatalf("MaxFrame %d < 4154", b.MaxFrame())
	}
	st, _ := b.Stats()
	if !st.Multi {
		t.Fatalf("multi-buffer not on at MTU 4200")
	}
	const n = 20000
	size := func(i int) int {
		switch i % 4 {
		case 0:
			return 4154 // 4096 payload + RETH + BTH + ICRC + IPv4/UDP/Eth
		case 1:
			return 3841 // one byte over a single chunk
		case 2:
			return 3840 // exactly one chunk
		}
		return 60 + i%4000
	}
	res, err := netnstest.Transfer(a, b, &pair.A, &pair.B, n, size, 512, 90*time.Second)
	t.Logf("%d frames in %v", res.Received, res.Elapsed)
	if err != nil {
		t.Fatal(err)
	}
	st, err = b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// Half the frames exceed one chunk: they must have come as two segments,
	// and been put together behind the first, where the kernel wrote it.
	if st.Socket.RxDescs < n+n/2 {
		t.Errorf("%d descriptors for %d frames: multi-buffer segments missing", st.Socket.RxDescs, n)
	}
	if st.Copied != 0 {
		t.Errorf("%d multi-buffer frames copied whole into a buffer of the port's", st.Copied)
	}
	// Too large for the port: refused with an error, not truncated.
	big := make([]byte, a.MaxFrame()+1)
	if k, err := port.Send(a, [][]byte{big}); err == nil || k != 0 {
		t.Errorf("Send of %d bytes: %d, %v; want 0 and an error", len(big), k, err)
	}
}

// TestMTULimitWithoutMultiBuffer: refusing multi-buffer on a jumbo MTU is a
// clear error at Open, never silent truncation.
func TestMTULimitWithoutMultiBuffer(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{MTU: 4200})
	err := pair.A.NS.Do(func() error {
		p, err := Open(Config{IfIndex: pair.A.Index, NoMultiBuffer: true})
		if err == nil {
			p.Close()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "MTU 4200") {
		t.Fatalf("Open with NoMultiBuffer at MTU 4200: %v; want an MTU error", err)
	}
}

func TestRecvSendAllocs(t *testing.T) {
	for _, c := range []struct {
		name      string
		mtu, size int
	}{{"single-buffer", 1500, 128}, {"multi-buffer", 4200, 4154}} {
		t.Run(c.name, func(t *testing.T) {
			pair := netnstest.NewTestPair(t, netnstest.PairOptions{MTU: c.mtu})
			a := openIn(t, &pair.A, Config{})
			b := openIn(t, &pair.B, Config{})
			frames := make([][]byte, port.BatchSize)
			out := make([][]byte, 16)
			for i := range out {
				out[i] = netnstest.RoCEFrame(make([]byte, c.size), &pair.A, &pair.B, uint32(i))
			}
			// Warm up: reassembly buffers are made once, then reused.
			var c port.Copier
			for i := 0; i < 20; i++ {
				if _, err := c.Send(a, out); err != nil {
					t.Fatal(err)
				}
				if _, err := b.Recv(frames, time.Millisecond); err != nil {
					t.Fatal(err)
				}
			}
			received := 0
			allocs := testing.AllocsPerRun(200, func() {
				if _, err := c.Send(a, out); err != nil {
					t.Fatal(err)
				}
				k, _ := b.Recv(frames, time.Millisecond)
				received += k
			})
			if allocs != 0 {
				t.Errorf("Lend+Submit+Recv allocate %.1f times per batch, want 0", allocs)
			}
			if received == 0 {
				t.Error("nothing received: the allocation count measured an idle path")
			}
		})
	}
}

// TestSendOversize: a frame over MaxFrame (the MTU's) is refused with an
// error, never sent for the kernel to drop; the port lends MaxFrame-byte
// slots and takes back only what it lent.
func TestSendOversize(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	a := openIn(t, &pair.A, Config{})
	if a.MaxFrame() != 1500+18 {
		t.Fatalf("MaxFrame %d at MTU 1500, want 1518", a.MaxFrame())
	}
	ok := make([]byte, a.MaxFrame())
	big := make([]byte, a.MaxFrame()+1)
	n, err := port.Send(a, [][]byte{ok, big, ok})
	if n != 1 || !errors.Is(err, port.ErrFrameSize) {
		t.Errorf("Send: %d, %v; want 1 and ErrFrameSize", n, err)
	}
	bufs := make([][]byte, 1)
	if a.Lend(bufs) != 1 || len(bufs[0]) != a.MaxFrame() {
		t.Fatalf("Lend: %d-byte slot, MaxFrame %d", len(bufs[0]), a.MaxFrame())
	}
	if n, err := a.Submit([][]byte{ok}); n != 0 || !errors.Is(err, port.ErrNotLent) {
		t.Errorf("Submit of a buffer it did not lend: %d, %v", n, err)
	}
	if n, err := a.Submit([][]byte{bufs[0][:0]}); n != 1 || err != nil {
		t.Errorf("Submit of an empty lent slot: %d, %v", n, err)
	}
}

func TestClosed(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	a := openIn(t, &pair.A, Config{})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Recv(make([][]byte, 1), 0); !errors.Is(err, port.ErrClosed) {
		t.Errorf("Recv after Close: %v", err)
	}
	if _, err := port.Send(a, [][]byte{make([]byte, 60)}); !errors.Is(err, port.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// The program was detached by Close.
	out, err := pair.A.NS.IP("link", "show", "dev", pair.A.Name)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "prog/xdp") {
		t.Errorf("XDP program still attached after Close:\n%s", out)
	}
}

// childEnv makes the test binary act as a process that attaches the program
// and waits to be killed.
const childEnv = "SOFTRNIC_AFXDP_CHILD"

func TestMain(m *testing.M) {
	if v := os.Getenv(childEnv); v != "" {
		os.Exit(child(v))
	}
	os.Exit(m.Run())
}

// child opens a port on ifindex (in the namespace given) and reports "ready";
// it then waits, bounded, for the parent's SIGKILL.
func child(arg string) int {
	nsName, rest, _ := strings.Cut(arg, ":")
	idx, modeStr, _ := strings.Cut(rest, ":")
	ifindex, err := strconv.Atoi(idx)
	if err != nil {
		fmt.Println("bad argument", arg)
		return 2
	}
	ns := &netnstest.NS{Name: nsName}
	if err := ns.Open(); err != nil {
		fmt.Println("open namespace:", err)
		return 2
	}
	var p *Port
	if err := ns.Do(func() (err error) {
		mode := bpf.DriverMode
		if modeStr == "generic" {
			mode = bpf.GenericMode
		}
		p, err = Open(Config{IfIndex: ifindex, XDPMode: mode})
		return err
	}); err != nil {
		fmt.Println("open port:", err)
		return 2
	}
	_ = p
	fmt.Println("ready")
	time.Sleep(30 * time.Second)
	return 3
}

// TestDetachedWhenProcessDies: a process that attached the program and is
// SIGKILLed leaves no XDP program on the interface (the BPF link dies with
// its last file descriptor).
func TestDetachedWhenProcessDies(t *testing.T) {
	for _, mode := range []string{"driver", "generic"} {
		t.Run(mode, func(t *testing.T) { detachedWhenDies(t, mode) })
	}
}

func detachedWhenDies(t *testing.T, mode string) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d:%s", childEnv, pair.A.NS.Name, pair.A.Index, mode))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		s.Scan()
		line <- s.Text()
	}()
	select {
	case l := <-line:
		if l != "ready" {
			t.Fatalf("child: %q", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("child did not attach within 20s")
	}
	show, err := pair.A.NS.IP("link", "show", "dev", pair.A.Name)
	if err != nil {
		t.Fatal(err)
	}
	// ip(8) shows the program as prog/xdp, with "xdpgeneric" (or "xdp")
	// after the MTU saying which mode.
	if !strings.Contains(show, "prog/xdp") || !strings.Contains(show, " "+map[string]string{"driver": "xdp", "generic": "xdpgeneric"}[mode]+" ") {
		t.Fatalf("child reported ready but no %s-mode program on the link:\n%s", mode, show)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed = true
	// The link is released as the process's files close; allow the kernel a
	// bounded moment to finish.
	for i := 0; i < 100; i++ {
		show, err = pair.A.NS.IP("link", "show", "dev", pair.A.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(show, "prog/xdp") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("XDP program still attached after the process was killed:\n%s", show)
}

// TestMultiQueue: one socket per queue, sharing one program whose XSKMAP
// sends each queue's RoCEv2 to that queue's socket. On veth a frame sent
// from transmit queue q arrives on the peer's receive queue q.
func TestMultiQueue(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{Queues: 2})
	progs := make([]*bpf.Program, 2)
	ports := make([][2]*Port, 2) // [side][queue]
	for side, l := range []*netnstest.Link{&pair.A, &pair.B} {
		if err := l.NS.Do(func() error {
			prog, err := bpf.Load(bpf.Options{Queues: 2})
			if err != nil {
				return err
			}
			progs[side] = prog
			if _, err := prog.Attach(l.Index); err != nil {
				return err
			}
			for q := 0; q < 2; q++ {
				p, err := Open(Config{IfIndex: l.Index, Queue: q, Program: prog})
				if err != nil {
					return err
				}
				ports[side][q] = p
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, s := range ports {
			for _, p := range s {
				if p != nil {
					p.Close()
				}
			}
		}
		for _, p := range progs {
			if p != nil {
				p.Close()
			}
		}
	})
	frames := make([][]byte, port.BatchSize)
	for q := 0; q < 2; q++ {
		f := netnstest.RoCEFrame(make([]byte, 200), &pair.A, &pair.B, uint32(100+q))
		if k, err := port.Send(ports[0][q], [][]byte{f}); k != 1 || err != nil {
			t.Fatalf("send on queue %d: %d, %v", q, k, err)
		}
		got := 0
		for deadline := time.Now().Add(10 * time.Second); got == 0 && time.Now().Before(deadline); {
			k, err := ports[1][q].Recv(frames, 10*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range frames[:k] {
				if string(g) != string(f) {
					t.Errorf("queue %d: unexpected frame", q)
				}
				got++
			}
		}
		if got != 1 {
			t.Errorf("queue %d: %d frames received, want 1", q, got)
		}
		other := ports[1][1-q]
		if k, _ := other.Recv(frames, 0); k != 0 {
			t.Errorf("frame from queue %d also arrived on queue %d", q, 1-q)
		}
	}

	// With queue 1's socket closed, RoCEv2 on queue 1 goes to the kernel
	// (counted unbound), not to another queue and not into a black hole.
	before, err := progs[1].Counters()
	if err != nil {
		t.Fatal(err)
	}
	ports[1][1].Close()
	f := netnstest.RoCEFrame(make([]byte, 200), &pair.A, &pair.B, 300)
	if k, err := port.Send(ports[0][1], [][]byte{f}); k != 1 || err != nil {
		t.Fatalf("send: %d, %v", k, err)
	}
	var after bpf.Counters
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if after, err = progs[1].Counters(); err != nil {
			t.Fatal(err)
		}
		if after.Unbound > before.Unbound || time.Now().After(deadline) {
			break
		}
	}
	if after.Unbound != before.Unbound+1 || after.Steered != before.Steered {
		t.Errorf("counters %+v -> %+v: want one more unbound, no more steered", before, after)
	}
	if k, _ := ports[1][0].Recv(frames, 10*time.Millisecond); k != 0 {
		t.Errorf("queue 1's frame arrived on queue 0")
	}
}

// TestGeometry: other UMEM geometries (2048-byte frames, headroom, a small
// pool) carry frames intact, multi-buffer included when 2048-byte chunks
// meet a 4200-byte MTU (three segments per 4154-byte frame).
func TestGeometry(t *testing.T) {
	for _, c := range []struct {
		name  string
		mtu   int
		cfg   Config
		multi bool
	}{
		{"2048+headroom", 1500, Config{FrameSize: 2048, Headroom: 128, NumFrames: 256}, false},
		{"2048 jumbo", 4200, Config{FrameSize: 2048, NumFrames: 512}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			pair := netnstest.NewTestPair(t, netnstest.PairOptions{MTU: c.mtu})
			a := openIn(t, &pair.A, c.cfg)
			b := openIn(t, &pair.B, c.cfg)
			st, err := b.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if st.Multi != c.multi {
				t.Fatalf("multi-buffer %v, want %v", st.Multi, c.multi)
			}
			maxf := min(a.MaxFrame(), c.mtu+14)
			const n = 10000
			size := func(i int) int { return 60 + (i*131)%(maxf-60+1) }
			res, err := netnstest.Transfer(a, b, &pair.A, &pair.B, n, size, 64, 60*time.Second)
			if err != nil {
				t.Fatalf("after %d frames: %v", res.Received, err)
			}
		})
	}
}

// TestVLANFrame: an 802.1Q-tagged RoCEv2 frame is steered and received with
// its tag, byte for byte.
func TestVLANFrame(t *testing.T) {
	for _, mode := range []bpf.AttachMode{bpf.DriverMode, bpf.GenericMode} {
		t.Run(mode.String(), func(t *testing.T) {
			pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
			a := openIn(t, &pair.A, Config{XDPMode: mode})
			b := openIn(t, &pair.B, Config{XDPMode: mode})
			plain := netnstest.RoCEFrame(make([]byte, 200), &pair.A, &pair.B, 7)
			tagged := append(append(append([]byte{}, plain[:12]...), 0x81, 0x00, 0x60, 0x64), plain[12:]...)
			if k, err := port.Send(a, [][]byte{tagged}); k != 1 || err != nil {
				t.Fatalf("Send: %d, %v", k, err)
			}
			frames := make([][]byte, port.BatchSize)
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
				k, err := b.Recv(frames, 20*time.Millisecond)
				if err != nil {
					t.Fatal(err)
				}
				if k > 0 {
					if k != 1 || string(frames[0]) != string(tagged) {
						t.Fatalf("received %d frames, first % x; want the tagged frame", k, frames[0][:min(20, len(frames[0]))])
					}
					return
				}
			}
			t.Fatal("tagged frame not received")
		})
	}
}

// TestLocalAddrs: with LocalAddrs the port receives RoCEv2 to its addresses
// only; RoCEv2 to another address stays with the kernel (counted foreign).
func TestLocalAddrs(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	a := openIn(t, &pair.A, Config{})
	b := openIn(t, &pair.B, Config{LocalAddrs: []netip.Addr{pair.B.Addr, pair.B.Addr6}})
	mine := netnstest.RoCEFrame(make([]byte, 100), &pair.A, &pair.B, 1)
	other := netnstest.RoCEFrame(make([]byte, 100), &pair.A, &pair.B, 2)
	other[33]++ // destination address .2 -> .3 (checksum left stale: not looked at)
	if k, err := port.Send(a, [][]byte{other, mine}); k != 2 || err != nil {
		t.Fatalf("Send: %d, %v", k, err)
	}
	frames := make([][]byte, port.BatchSize)
	var got [][]byte
	recv := func(timeout time.Duration) {
		k, err := b.Recv(frames, timeout)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range frames[:k] {
			got = append(got, append([]byte(nil), f...))
		}
	}
	for deadline := time.Now().Add(10 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
		recv(10 * time.Millisecond)
	}
	// The other frame went first: steered to the socket, it would have
	// come before ours. A short wait more catches a late one.
	recv(50 * time.Millisecond)
	if len(got) != 1 || string(got[0]) != string(mine) {
		t.Fatalf("received %d frames; want only the one to %v", len(got), pair.B.Addr)
	}
	st, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Program.Foreign != 1 {
		t.Errorf("foreign %d, want 1", st.Program.Foreign)
	}
}

// TestBusyPoll: a port with busy polling (SO_BUSY_POLL and friends) opens
// and carries frames intact.
func TestBusyPoll(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	cfg := Config{BusyPoll: 20 * time.Microsecond, PreferBusyPoll: true, BusyPollBudget: 64}
	a := openIn(t, &pair.A, cfg)
	b := openIn(t, &pair.B, cfg)
	size := func(i int) int { return 60 + i%1400 }
	if res, err := netnstest.Transfer(a, b, &pair.A, &pair.B, 5000, size, 256, 30*time.Second); err != nil {
		t.Fatalf("after %d frames: %v", res.Received, err)
	}
}

// TestIdleRecvAllocs: waiting on an idle port (the engine's idle loop, with
// sub-millisecond timeouts) does not allocate.
func TestIdleRecvAllocs(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	b := openIn(t, &pair.B, Config{})
	frames := make([][]byte, port.BatchSize)
	if allocs := testing.AllocsPerRun(50, func() { _, _ = b.Recv(frames, 50*time.Microsecond) }); allocs != 0 {
		t.Errorf("idle Recv allocates %.1f times, want 0", allocs)
	}
	if st, _ := b.Stats(); st.Socket.Polls == 0 {
		t.Error("no poll happened: the idle path was not measured")
	}
}

// TestRxLevel: a port with RxBuffers receive buffers at MTU 4200 counts
// two buffers to a frame (RxFrames), and its gauge follows frames the
// kernel received and the reader has not taken (two descriptors each), the
// FILL ring short of as many, until Recv takes them and the next Recv
// gives their buffers back.
func TestRxLevel(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{MTU: 4200})
	a := openIn(t, &pair.A, Config{})
	b := openIn(t, &pair.B, Config{NumFrames: 256, RxBuffers: 64})
	if got := b.RxFrames(); got != 32 {
		t.Fatalf("RxFrames %d, want 32 (64 buffers, two to a frame)", got)
	}
	if f, q, n := b.RxLevel(); f != 64 || q != 0 || n != 64 {
		t.Fatalf("fresh: fill %d queued %d buffers %d, want 64 0 64", f, q, n)
	}
	const frames = 10
	out := make([][]byte, frames)
	for i := range out {
		out[i] = netnstest.RoCEFrame(make([]byte, 4154), &pair.A, &pair.B, uint32(i))
	}
	if k, err := port.Send(a, out); err != nil || k != frames {
		t.Fatalf("sent %d of %d: %v", k, frames, err)
	}
	var f, q int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if f, q, _ = b.RxLevel(); q >= 2*frames {
			break
		}
	}
	if q != 2*frames || f != 64-2*frames {
		t.Fatalf("%d frames received: fill %d queued %d, want %d and %d", frames, f, q, 64-2*frames, 2*frames)
	}
	in := make([][]byte, 64)
	got := 0
	for deadline := time.Now().Add(10 * time.Second); got < frames && time.Now().Before(deadline); {
		n, err := b.Recv(in[got:], 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	if _, q, _ = b.RxLevel(); got != frames || q != 0 {
		t.Fatalf("read %d of %d frames, queued %d after", got, frames, q)
	}
	if _, err := b.Recv(in, 0); err != nil {
		t.Fatal(err)
	}
	if f, q, _ = b.RxLevel(); f != 64 || q != 0 {
		t.Fatalf("after the buffers went back: fill %d queued %d, want 64 and 0", f, q)
	}
}
