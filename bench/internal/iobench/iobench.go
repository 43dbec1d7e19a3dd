package iobench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/afpacket"
	"github.com/softrnic/softrnic/port/afxdp"
	"golang.org/x/sys/unix"
)

// Result is one row of the bench.
type Result struct {
	Port   string `json:"port"`   // afxdp or afpacket
	Test   string `json:"test"`   // tx-only, tx-threaded, rx-only, rx-gen, ping-pong
	Size   int    `json:"size"`   // frame bytes
	Mode   string `json:"mode"`   // how the port ran (XDP attach mode, copy or zero-copy)
	Frames uint64 `json:"frames"` // frames counted
	// FramesPerSec and Gbps: transmitted (tx-only) or received (rx-only)
	// per second.
	FramesPerSec float64 `json:"frames_per_sec,omitempty"`
	Gbps         float64 `json:"gbps,omitempty"`
	RoundTrips   float64 `json:"round_trips_per_sec,omitempty"` // ping-pong, one at a time
	SentPerSec   float64 `json:"sent_per_sec,omitempty"`        // rx-only: what the sender offered
	// Delivered (tx-only with the sink as peer): frames the peer's XDP
	// sink counted, read after the sender stopped; a frame can only be
	// missing if veth dropped it (its ring of 256 was full).
	Delivered uint64 `json:"delivered,omitempty"`
	// CPUSeconds is the user+system CPU time the bench process (sender and
	// receiver, and the kernel work done in their system calls) used during
	// the test; FramesPerCPUSec = Frames / CPUSeconds is therefore much less
	// sensitive than FramesPerSec to other load on the machine.
	CPUSeconds      float64 `json:"cpu_seconds,omitempty"`
	FramesPerCPUSec float64 `json:"frames_per_cpu_sec,omitempty"`
	RTTMeanUs       float64 `json:"rtt_mean_us,omitempty"`
	RTTP50Us        float64 `json:"rtt_p50_us,omitempty"`
	RTTP99Us        float64 `json:"rtt_p99_us,omitempty"`
	Lost            uint64  `json:"lost,omitempty"` // ping-pong: requests without a reply in 100 ms
	Error           string  `json:"error,omitempty"`
	// Sender and receiver port counters after the test (syscalls, drops...).
	SenderStats   any `json:"sender_stats,omitempty"`
	ReceiverStats any `json:"receiver_stats,omitempty"`
}

// Report is the JSON document.
type Report struct {
	When     time.Time `json:"when"`
	Kernel   string    `json:"kernel"`
	CPUs     int       `json:"cpus"`
	Go       string    `json:"go"`
	Duration string    `json:"duration_per_test"`
	Note     string    `json:"note"`
	Results  []Result  `json:"results"`
}

// Summary is one line for a result: the rate, or the round-trip percentiles.
func Summary(r Result) string {
	if r.Error != "" {
		return "error: " + r.Error
	}
	if r.Test == "ping-pong" {
		return fmt.Sprintf("p50 %.1f µs, p99 %.1f µs", r.RTTP50Us, r.RTTP99Us)
	}
	if r.Delivered > 0 {
		return fmt.Sprintf("%.3f Mpps, %.2f Gbit/s, %d of %d frames counted by the peer's sink", r.FramesPerSec/1e6, r.Gbps, r.Delivered, r.Frames)
	}
	return fmt.Sprintf("%.3f Mpps, %.2f Gbit/s", r.FramesPerSec/1e6, r.Gbps)
}

// PrintTable writes the results as an aligned table with a footnote.
func PrintTable(out io.Writer, rep Report) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "port\ttest\tsize B\tMpps\tGbit/s\toffered Mpps\tMpps per CPU-s\tRTT p50 µs\tRTT p99 µs\tmode\t\n")
	for _, r := range rep.Results {
		if r.Error != "" {
			fmt.Fprintf(w, "%s\t%s\t%d\t\t\t\t\t\t\terror: %s\t\n", r.Port, r.Test, r.Size, r.Error)
			continue
		}
		mpps, gbps, off, percpu, p50, p99 := "", "", "", "", "", ""
		if r.FramesPerCPUSec > 0 {
			percpu = fmt.Sprintf("%.3f", r.FramesPerCPUSec/1e6)
		}
		if r.Test == "ping-pong" {
			p50, p99 = fmt.Sprintf("%.1f", r.RTTP50Us), fmt.Sprintf("%.1f", r.RTTP99Us)
		} else {
			mpps, gbps = fmt.Sprintf("%.3f", r.FramesPerSec/1e6), fmt.Sprintf("%.2f", r.Gbps)
		}
		if r.SentPerSec > 0 {
			off = fmt.Sprintf("%.3f", r.SentPerSec/1e6)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Port, r.Test, r.Size, mpps, gbps, off, percpu, p50, p99, r.Mode)
	}
	w.Flush()
	fmt.Fprintf(out, "(%s, %d CPUs, %s; %s)\n", rep.Kernel, rep.CPUs, rep.Go, rep.Note)
	fmt.Fprintln(out, "(for comparison, C xdpsock in copy mode is published at 1.4-1.7 Mpps per queue at 64 B on real NICs)")
}

// Config is how the ports are opened.
type Config struct {
	XDPAttach bpf.AttachMode // AF_XDP attach mode (0: let the port choose)
	BusyPoll  time.Duration  // AF_XDP SO_BUSY_POLL time (0: off), with SO_PREFER_BUSY_POLL
	// TxPort makes the peer of tx-only a port of the same kind that does
	// not read (the kernel drops the excess at its full ring or buffer)
	// instead of the XDP sink (bpf.Sink), which counts and drops every
	// frame at the XDP hook. Over veth the sender's sendto runs the peer's
	// receive path, so the peer's cost is billed to the transmit figure:
	// the sink is the cheapest peer and the same for both port kinds.
	TxPort bool
}

// open opens a port of the given kind on l, inside l's namespace.
func open(cfg Config, kind string, l *netnstest.Link) (p port.Port, mode string, err error) {
	err = l.NS.Do(func() error {
		switch kind {
		case "afxdp":
			x, err := afxdp.Open(afxdp.Config{IfIndex: l.Index, XDPMode: cfg.XDPAttach, BusyPoll: cfg.BusyPoll, PreferBusyPoll: cfg.BusyPoll > 0})
			if err != nil {
				return err
			}
			st, _ := x.Stats()
			zc := "copy"
			if st.ZeroCopy {
				zc = "zero-copy"
			}
			mode = fmt.Sprintf("XDP %v, %s", st.AttachMode, zc)
			if st.Multi {
				mode += ", multi-buffer"
			}
			if cfg.BusyPoll > 0 {
				mode += ", busy-poll " + cfg.BusyPoll.String()
			}
			p = x
		case "afpacket":
			a, err := afpacket.Open(afpacket.Config{IfIndex: l.Index})
			if err != nil {
				return err
			}
			mode, p = "TPACKET_V2 ring, sendmmsg", a
		default:
			return fmt.Errorf("unknown port %q", kind)
		}
		return nil
	})
	return p, mode, err
}

// Run opens a port of the given kind (afxdp or afpacket) on each end of
// pair and runs one test (tx-only, tx-threaded, rx-only, rx-gen or ping-pong) with frames of size
// bytes: rate tests for dur, ping-pong for at most pings round trips or
// 2×dur. Failures are reported in Result.Error, not returned, so that a
// bench table still shows every row.
func Run(pair *netnstest.Pair, cfg Config, kind, test string, size int, dur time.Duration, pings int) (r Result) {
	r = Result{Port: kind, Test: test, Size: size}
	a, mode, err := open(cfg, kind, &pair.A)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer func() { r.teardown(a.Close()) }()
	var b port.Port
	var sink *bpf.Sink
	if (test == "tx-only" || test == "tx-threaded") && !cfg.TxPort {
		err = pair.B.NS.Do(func() (err error) {
			sink, err = bpf.AttachSink(pair.B.Index)
			return err
		})
		if err != nil {
			r.Error = err.Error()
			return r
		}
		defer func() { r.teardown(sink.Close()) }()
		mode += ", peer: XDP sink"
		if test == "tx-threaded" {
			if err := pair.B.SetThreadedNAPI(true); err != nil {
				r.Error = err.Error()
				return r
			}
			// Off before the sink goes: later tests on this pair measure
			// the default.
			defer func() { r.teardown(pair.B.SetThreadedNAPI(false)) }()
			mode += ", threaded NAPI"
			// As rx-gen does, and as two hosts are: the sender on one CPU,
			// the peer's receive on the other. Left to the scheduler, the
			// NAPI thread often shared the sender's CPU (README's bench
			// notes).
			if n, err := pinNAPIThreads(pair.B.Name, genCPU); err != nil || n == 0 {
				r.Error = fmt.Sprintf("pinning %s's NAPI thread: %d pinned, %v", pair.B.Name, n, err)
				return r
			}
			mode += " (pinned)"
		}
	} else {
		if b, _, err = open(cfg, kind, &pair.B); err != nil {
			r.Error = err.Error()
			return r
		}
		defer func() { r.teardown(b.Close()) }()
	}
	r.Mode = mode
	if size > a.MaxFrame() {
		r.Error = fmt.Sprintf("frame %d > MaxFrame %d", size, a.MaxFrame())
		return r
	}
	cpu0 := CPUTime()
	defer func() {
		if r.Error == "" && r.Test != "ping-pong" {
			r.CPUSeconds = CPUTime() - cpu0
			if r.CPUSeconds > 0 {
				r.FramesPerCPUSec = float64(r.Frames) / r.CPUSeconds
			}
		}
	}()
	switch test {
	case "tx-only":
		err = txOnly(&r, pair, a, sink, size, dur)
	case "tx-threaded":
		runtime.LockOSThread()
		unpin := pinThread(rxCPU)
		err = txOnly(&r, pair, a, sink, size, dur)
		unpin()
		runtime.UnlockOSThread()
	case "rx-only":
		err = rxOnly(&r, pair, a, b, size, dur)
	case "rx-gen":
		err = rxGen(&r, pair, b, size, dur)
	case "ping-pong":
		err = pingPong(&r, pair, a, b, size, dur, pings)
	default:
		err = fmt.Errorf("unknown test %q", test)
	}
	if err != nil {
		r.Error = err.Error()
	}
	r.SenderStats = portStats(a)
	if b != nil {
		r.ReceiverStats = portStats(b)
	}
	return r
}

func portStats(p port.Port) any {
	switch p := p.(type) {
	case *afxdp.Port:
		st, _ := p.Stats()
		return st
	case *afpacket.Port:
		st, _ := p.Stats()
		return st
	}
	return nil
}

// teardown records the failure of a step that ends a test, unless the test
// failed already.
func (r *Result) teardown(err error) {
	if err != nil && r.Error == "" {
		r.Error = "teardown: " + err.Error()
	}
}

// CPUTime is the process's user+system CPU time in seconds.
func CPUTime() float64 {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru) // fails only for a bad pointer
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// Kernel is the running kernel's release, for the benches' reports.
func Kernel() string {
	var uts unix.Utsname
	_ = unix.Uname(&uts) // fails only for a bad pointer
	return unix.ByteSliceToString(uts.Release[:])
}

func batchOf(pair *netnstest.Pair, size int) [][]byte {
	out := make([][]byte, port.BatchSize)
	for i := range out {
		out[i] = netnstest.RoCEFrame(make([]byte, size), &pair.A, &pair.B, uint32(i))
	}
	return out
}

// txOnly: how fast a sends. The peer is the XDP sink, which counts what
// arrived (Delivered), or with Config.TxPort an open port that does not
// read, so its rings or buffers fill and the kernel drops the excess.
func txOnly(r *Result, pair *netnstest.Pair, a port.Port, sink *bpf.Sink, size int, dur time.Duration) error {
	out := batchOf(pair, size)
	var sent uint64
	var c port.Copier
	start := time.Now()
	deadline := start.Add(dur)
	for i := 0; ; i++ {
		if i%64 == 0 && time.Now().After(deadline) {
			break
		}
		n, err := c.Send(a, out)
		if err != nil {
			return err
		}
		sent += uint64(n)
	}
	el := time.Since(start).Seconds()
	r.Frames = sent
	r.FramesPerSec = float64(sent) / el
	r.Gbps = r.FramesPerSec * float64(size) * 8 / 1e9
	if sink != nil {
		// Frames still in the peer's ring or in flight arrive within
		// moments; wait (bounded) until the count stops moving. A count
		// still at 0 is not settled: a threaded NAPI on a busy host may
		// not have run yet (give it 100 ms).
		var last uint64
		for i := 0; i < 100; i++ {
			n, err := sink.Count()
			if err != nil {
				return err
			}
			if i > 0 && n == last && (n > 0 || i >= 20) {
				break
			}
			last = n
			time.Sleep(5 * time.Millisecond)
		}
		r.Delivered = last
		if last > sent {
			return fmt.Errorf("the sink counted %d frames but %d were sent", last, sent)
		}
	}
	return nil
}

// rxOnly: how fast b receives while a sends flat out on another goroutine.
func rxOnly(r *Result, pair *netnstest.Pair, a, b port.Port, size int, dur time.Duration) error {
	out := batchOf(pair, size)
	var stop atomic.Bool
	var sent atomic.Uint64
	serr := make(chan error, 1)
	go func() {
		var n uint64
		var c port.Copier
		for !stop.Load() {
			k, err := c.Send(a, out)
			if err != nil {
				serr <- err
				return
			}
			n += uint64(k)
			if n&1023 < uint64(k) {
				sent.Store(n)
			}
		}
		sent.Store(n)
		serr <- nil
	}()
	frames := make([][]byte, port.BatchSize)
	// Let the pipeline fill before counting.
	warm := time.Now().Add(dur / 10)
	for time.Now().Before(warm) {
		if _, err := b.Recv(frames, time.Millisecond); err != nil {
			stop.Store(true)
			return errors.Join(err, <-serr)
		}
	}
	var got uint64
	s0 := sent.Load()
	start := time.Now()
	deadline := start.Add(dur)
	var rerr error
	for i := 0; ; i++ {
		if i%64 == 0 && time.Now().After(deadline) {
			break
		}
		n, err := b.Recv(frames, time.Millisecond)
		if err != nil {
			rerr = err
			break
		}
		got += uint64(n)
	}
	el := time.Since(start).Seconds()
	s1 := sent.Load()
	stop.Store(true)
	if err := errors.Join(rerr, <-serr); err != nil {
		return err
	}
	r.Frames = got
	r.FramesPerSec = float64(got) / el
	r.Gbps = r.FramesPerSec * float64(size) * 8 / 1e9
	r.SentPerSec = float64(s1-s0) / el
	return nil
}

// rxGen: how fast b receives frames sent by the kernel-side generator
// (bpf.Generator, XDP live frames redirected out of a's veth end) rather than
// by an AF_XDP sender. In copy mode over veth the sender's sendto pays for
// an skb, a copy and the peer's NAPI poll per frame, and on a small machine
// that sets the rx-only figure; the generator skips the skb and the system
// call, so this row measures the receive path: veth's NAPI, the steering
// program, the kernel's copy into the UMEM and the port. Every frame is
// checked byte for byte against the one generated. Only for AF_XDP (veth
// delivers redirected frames to the peer's XDP path only) and frames up to
// bpf.MaxGeneratorFrame.
func rxGen(r *Result, pair *netnstest.Pair, b port.Port, size int, dur time.Duration) (err error) {
	if _, ok := b.(*afxdp.Port); !ok {
		return fmt.Errorf("rx-gen needs the AF_XDP port on the receiving end")
	}
	if size > bpf.MaxGeneratorFrame {
		return fmt.Errorf("the generator builds frames up to %d bytes", bpf.MaxGeneratorFrame)
	}
	frame := netnstest.RoCEFrame(make([]byte, size), &pair.A, &pair.B, 1)
	var gen *bpf.Generator
	if err := pair.A.NS.Do(func() (err error) {
		gen, err = bpf.NewGenerator(pair.A.Index)
		return err
	}); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, gen.Close()) }()
	var stop atomic.Bool
	var sent atomic.Uint64
	serr := make(chan error, 1)
	go func() {
		// One thread in a's namespace for the whole run: the kernel
		// resolves the ifindex in the caller's namespace. Each call sets
		// up and tears down a page pool (milliseconds), so it sends many
		// frames; the kernel sends them in batches of 64, like a NAPI
		// poll, and the offered rate is counted per call.
		const perCall = 1 << 16
		serr <- pair.A.NS.Do(func() error {
			// The generator's thread also runs the veth NAPI poll it
			// schedules (steering program and copy into the UMEM): keep
			// it, and the receiver below, each on a CPU of its own.
			defer pinThread(genCPU)()
			for !stop.Load() {
				if err := gen.Send(frame, perCall); err != nil {
					return err
				}
				sent.Add(perCall)
			}
			return nil
		})
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer pinThread(rxCPU)()
	frames := make([][]byte, port.BatchSize)
	var got, bad uint64
	recv := func() error {
		n, err := b.Recv(frames, time.Millisecond)
		for _, f := range frames[:n] {
			if !bytes.Equal(f, frame) {
				bad++
			}
		}
		got += uint64(n)
		return err
	}
	warm := time.Now().Add(dur / 10)
	var rerr error
	for time.Now().Before(warm) && rerr == nil {
		rerr = recv()
	}
	got = 0
	s0 := sent.Load()
	start := time.Now()
	deadline := start.Add(dur)
	for i := 0; rerr == nil; i++ {
		if i%64 == 0 && time.Now().After(deadline) {
			break
		}
		rerr = recv()
	}
	el := time.Since(start).Seconds()
	s1 := sent.Load()
	stop.Store(true)
	if err := errors.Join(rerr, <-serr); err != nil {
		return err
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d frames received differ from the frame sent", bad, got)
	}
	r.Frames = got
	r.FramesPerSec = float64(got) / el
	r.Gbps = r.FramesPerSec * float64(size) * 8 / 1e9
	r.SentPerSec = float64(s1-s0) / el
	return nil
}

// pinNAPIThreads binds the threaded-NAPI kernel threads of device dev
// (named napi/DEV-ID, cut to 15 bytes) to cpu, and reports how many it
// bound.
func pinNAPIThreads(dev string, cpu int) (int, error) {
	prefix := "napi/" + dev + "-"
	if len(prefix) > 15 {
		prefix = prefix[:15]
	}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var set unix.CPUSet
	set.Set(cpu)
	n := 0
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile("/proc/" + d.Name() + "/comm")
		if err != nil || !strings.HasPrefix(string(comm), prefix) {
			continue
		}
		if err := unix.SchedSetaffinity(pid, &set); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// genCPU and rxCPU are where rx-gen runs the generator (and the NAPI poll
// it drives) and the receiver, as xdpsock-style benches pin theirs.
const genCPU, rxCPU = 0, 1

// pinThread binds the calling (locked) OS thread to cpu when the machine has
// it, and returns what restores the thread's previous CPU set.
func pinThread(cpu int) func() {
	var old, set unix.CPUSet
	if unix.SchedGetaffinity(0, &old) != nil || !old.IsSet(cpu) || old.Count() < 2 {
		return func() {}
	}
	set.Set(cpu)
	if unix.SchedSetaffinity(0, &set) != nil {
		return func() {}
	}
	return func() { _ = unix.SchedSetaffinity(0, &old) } // best effort, as the pinning
}

// pingPong: a sends one frame, b returns it (MACs swapped), a waits for it;
// both block in Recv (poll) rather than spin, as a daemon would.
func pingPong(r *Result, pair *netnstest.Pair, a, b port.Port, size int, dur time.Duration, pings int) error {
	var stop atomic.Bool
	echoErr := make(chan error, 1)
	go func() {
		frames := make([][]byte, port.BatchSize)
		var bc port.Copier
		reply := make([][]byte, port.BatchSize)
		for i := range reply {
			reply[i] = make([]byte, b.MaxFrame())
		}
		for !stop.Load() {
			n, err := b.Recv(frames, 10*time.Millisecond)
			if err != nil {
				echoErr <- err
				return
			}
			for i, f := range frames[:n] {
				reply[i] = reply[i][:len(f)]
				copy(reply[i], f)
				copy(reply[i][0:6], f[6:12])
				copy(reply[i][6:12], f[0:6])
			}
			for sent := 0; sent < n && !stop.Load(); {
				k, err := bc.Send(b, reply[sent:n])
				if err != nil {
					echoErr <- err
					return
				}
				sent += k
			}
		}
		echoErr <- nil
	}()
	var ac port.Copier
	req := [][]byte{make([]byte, size)}
	frames := make([][]byte, port.BatchSize)
	rtts := make([]time.Duration, 0, pings)
	var lost uint64
	deadline := time.Now().Add(2 * dur)
	var err error
	for seq := 0; seq < pings && time.Now().Before(deadline) && err == nil; seq++ {
		netnstest.RoCEFrame(req[0], &pair.A, &pair.B, uint32(seq))
		t0 := time.Now()
		var k int
		if k, err = ac.Send(a, req); err != nil || k != 1 {
			lost++
			continue
		}
		got := false
		for !got && time.Since(t0) < 100*time.Millisecond {
			var n int
			n, err = a.Recv(frames, 10*time.Millisecond)
			if err != nil {
				break
			}
			for _, f := range frames[:n] {
				if len(f) >= 46 && f[42] == req[0][42] && f[43] == req[0][43] && f[44] == req[0][44] && f[45] == req[0][45] {
					got = true
				}
			}
		}
		if got {
			rtts = append(rtts, time.Since(t0))
		} else {
			lost++
		}
	}
	stop.Store(true)
	if e := <-echoErr; e != nil && err == nil {
		err = e
	}
	if err != nil {
		return err
	}
	if len(rtts) == 0 {
		return fmt.Errorf("no round trip completed")
	}
	var total time.Duration
	for _, d := range rtts {
		total += d
	}
	slices.Sort(rtts)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	r.Frames = uint64(len(rtts))
	r.RTTMeanUs = us(total / time.Duration(len(rtts)))
	r.RTTP50Us = us(rtts[len(rtts)/2])
	r.RTTP99Us = us(rtts[len(rtts)*99/100])
	r.RoundTrips = float64(len(rtts)) / total.Seconds()
	r.Lost = lost
	return nil
}
