package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/perftest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
)

// ccHosts returns two hosts with DCQCN set from args (--dcqcn,
// --dcqcn-scale) joined by an in-memory link that marks a share ce of the
// ECT frames CE, each host's Stats read through its engine loop, as
// RunCLI does.
func ccHosts(t *testing.T, args []string, ce float64) (a, b Host) {
	t.Helper()
	p, err := perftest.ParseArgs(perftest.Write, perftest.BW, args)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := CongestionFor(p)
	if err != nil {
		t.Fatal(err)
	}
	return linkHosts(t, cc, memlink.Impairments{CEMark: ce})
}

// linkHosts returns two hosts with congestion control cc joined by an
// in-memory link with impairments imp, each host's Stats read through its
// engine loop, as RunCLI does.
func linkHosts(t *testing.T, cc rnic.Congestion, imp memlink.Impairments) (a, b Host) {
	t.Helper()
	pa, pb := memlink.NewPair(memlink.Config{MaxFrame: 1700, Seed: 7, Impairments: imp})
	t.Cleanup(func() { pa.Close(); pb.Close() })
	ia := host.Interface{Name: "mla", MTU: 1500, MAC: [6]byte{2, 0, 0, 0, 0, 0xa}, GIDs: []netip.Addr{netip.MustParseAddr("10.7.0.1")}}
	ifb := host.Interface{Name: "mlb", MTU: 1500, MAC: [6]byte{2, 0, 0, 0, 0, 0xb}, GIDs: []netip.Addr{netip.MustParseAddr("10.7.0.2")}}
	mk := func(self, peer host.Interface, pt *memlink.Port) Host {
		dev, err := host.NewDevice(self, host.DeviceOptions{Congestion: cc, Resolve: func(context.Context, netip.Addr) ([6]byte, error) { return peer.MAC, nil }})
		if err != nil {
			t.Fatal(err)
		}
		l, err := engine.NewLoop(dev, pt, engine.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- l.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("engine: %v", err)
			}
		})
		return Host{Device: dev, Iface: self, Stats: l.DeviceStats}
	}
	return mk(ia, ifb, pa), mk(ifb, ia, pb)
}

// runPairJSON runs one test as RunCLI does after its side channel
// (execJSON: the test, then its --json output) between a server on s and
// a client on c over loopback TCP, and returns both outputs.
func runPairJSON(t *testing.T, s, c Host, args ...string) (sout, cout string) {
	t.Helper()
	ps, err := perftest.ParseArgs(perftest.Write, perftest.BW, args)
	if err != nil {
		t.Fatal(err)
	}
	pc := ps
	pc.Host = "127.0.0.1"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var sbuf, cbuf bytes.Buffer
	serr := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			serr <- err
			return
		}
		defer conn.Close()
		_, err = execJSON(ctx, s, ps, conn, &sbuf)
		serr <- err
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_, cerr := execJSON(ctx, c, pc, conn, &cbuf)
	conn.Close()
	if err := <-serr; err != nil || cerr != nil {
		t.Fatalf("server: %v\nclient: %v\nserver output:\n%s\nclient output:\n%s", err, cerr, sbuf.String(), cbuf.String())
	}
	return sbuf.String(), cbuf.String()
}

// jsonDCQCN decodes the JSON objects of out and returns their "dcqcn"
// objects.
func jsonDCQCN(t *testing.T, out string) []DCQCNJSON {
	t.Helper()
	var ds []DCQCNJSON
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var v struct {
			DCQCN   *DCQCNJSON       `json:"dcqcn"`
			Results []map[string]any `json:"results_bw"`
		}
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%v in\n%s", err, out)
		}
		if v.DCQCN == nil {
			t.Fatalf("no dcqcn object in\n%s", out)
		}
		ds = append(ds, *v.DCQCN)
	}
	return ds
}

// TestDCQCNJSON runs write_bw with DCQCN over a link that marks 5 % of
// the frames CE: the server's device receives marks and sends CNPs, the
// client's takes them and cuts its QP's rate, and both --json outputs say
// so under the mlx5 names, with the profile, the scale and the QP's final
// rates.
func TestDCQCNJSON(t *testing.T) {
	args := []string{"-s", "65536", "-n", "300", "--json", "--dcqcn", "paper", "--dcqcn-scale", "2"}
	a, b := ccHosts(t, args, 0.05)
	sout, cout := runPairJSON(t, a, b, args...)
	s, c := jsonDCQCN(t, sout), jsonDCQCN(t, cout)
	if len(s) != 1 || len(c) != 1 {
		t.Fatalf("%d server and %d client JSON objects, want 1 each", len(s), len(c))
	}
	for _, d := range []DCQCNJSON{s[0], c[0]} {
		if d.Profile != "paper" || d.Scale != 2 || len(d.QPs) != 1 || d.ECNMarked == nil || d.CNPSent == nil ||
			d.CNPHandled == nil || d.CNPIgnored == nil || d.Peer == "" {
			t.Fatalf("dcqcn object %+v: want profile paper, scale 2, one QP, the four counters, the peer", d)
		}
	}
	sq, cq := s[0].QPs[0], c[0].QPs[0]
	if *s[0].ECNMarked == 0 || *s[0].CNPSent == 0 || sq.ECNMarked == 0 || sq.CNPSent == 0 {
		t.Errorf("server saw no CE marks or sent no CNPs: %+v, QP %+v", s[0], sq)
	}
	if *s[0].CNPSent > *s[0].ECNMarked || sq.CNPSent > sq.ECNMarked {
		t.Errorf("server sent more CNPs than it saw marks: %+v, QP %+v", s[0], sq)
	}
	if *c[0].CNPHandled == 0 || cq.CNPHandled == 0 || cq.Cuts == 0 {
		t.Errorf("client handled no CNPs: %+v, QP %+v", c[0], cq)
	}
	// paper's line rate is 40 Gb/s; dilated by 2, 20 Gb/s. The rate may
	// be back at it: the rate-increase timers run on after the last CNP
	// and recover in milliseconds, so how far depends on when the output
	// is taken. What holds whenever it is: R_C ≤ R_T ≤ the line rate
	// (every increase caps R_T and averages R_C towards it, every cut
	// lowers R_C), and α > 0 once a CNP set it.
	if cq.RateMbps <= 0 || cq.RateMbps > cq.TargetMbps || cq.TargetMbps > 20000 || cq.Alpha <= 0 || cq.Alpha > 1 {
		t.Errorf("client QP's final state %+v: want 0 < rate ≤ target ≤ 20000 Mb/s, 0 < α ≤ 1", cq)
	}
}

// TestDCQCNOffJSON: without --dcqcn the JSON has its results and no
// dcqcn object.
func TestDCQCNOffJSON(t *testing.T) {
	a, b := memlinkHosts(t)
	_, cout := runPairJSON(t, a, b, "-s", "4096", "-n", "50", "--json")
	if !strings.Contains(cout, "results_bw") || strings.Contains(cout, "dcqcn") {
		t.Fatalf("dcqcn object with DCQCN off:\n%s", cout)
	}
}

// TestServeClients: a server with --clients 2 serves two clients at once
// on its one device, one JSON object each with its own QP's counts, the
// device's counters covering both.
func TestServeClients(t *testing.T) {
	args := []string{"-s", "65536", "-n", "200", "--json", "--dcqcn", "paper", "--clients", "2"}
	a, b := ccHosts(t, args, 0.05)
	ps, err := perftest.ParseArgs(perftest.Write, perftest.BW, args)
	if err != nil {
		t.Fatal(err)
	}
	// A free TCP port for the server's listener.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ps.Port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	listening := make(chan struct{})
	var sout bytes.Buffer
	var sres Result
	serr := make(chan error, 1)
	go func() {
		var err error
		sres, err = serveClients(ctx, a, ps, CLIOptions{Listening: func(net.Addr) { close(listening) }}, &sout)
		serr <- err
	}()
	select {
	case <-listening:
	case err := <-serr:
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	couts := make([]bytes.Buffer, 2)
	cerrs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pc := ps
			pc.Host, pc.Clients = "127.0.0.1", 1
			_, cerrs[i] = runOne(ctx, b, pc, CLIOptions{DialFor: 5 * time.Second}, &couts[i])
		}()
	}
	wg.Wait()
	if err := <-serr; err != nil || cerrs[0] != nil || cerrs[1] != nil {
		t.Fatalf("server: %v, clients: %v, %v\nserver output:\n%s", err, cerrs[0], cerrs[1], sout.String())
	}
	if len(sres.BW) != 2 || len(sres.CC) != 2 || sres.CC[0].QPN == sres.CC[1].QPN {
		t.Fatalf("server result %+v: want two BW rows and two distinct QPs", sres)
	}
	ds := jsonDCQCN(t, sout.String())
	if len(ds) != 2 {
		t.Fatalf("%d server JSON objects, want 2:\n%s", len(ds), sout.String())
	}
	var marks, dev uint64
	for _, d := range ds {
		if len(d.QPs) != 1 || d.QPs[0].ECNMarked == 0 || d.QPs[0].CNPSent == 0 {
			t.Errorf("client's QP counts %+v: want one QP that saw marks and sent CNPs", d.QPs)
			continue
		}
		marks += d.QPs[0].ECNMarked
		dev = max(dev, *d.ECNMarked)
	}
	// The device counter (a snapshot as of the engine's last change) covers
	// both QPs, and no more than they saw.
	if dev == 0 || dev > marks || dev <= ds[0].QPs[0].ECNMarked && dev <= ds[1].QPs[0].ECNMarked {
		t.Errorf("device np_ecn_marked_roce_packets %d, QPs' %d and %d: want the device's to cover both", dev, ds[0].QPs[0].ECNMarked, ds[1].QPs[0].ECNMarked)
	}
	for i := range couts {
		if c := jsonDCQCN(t, couts[i].String()); len(c) != 1 || c[0].QPs[0].CNPHandled == 0 {
			t.Errorf("client %d: %+v: want one QP that handled CNPs", i, c)
		}
	}
}

// TestCongestionFor: the algorithm, profile and dilation of --cc,
// --dcqcn and --cc-scale (or --dcqcn-scale), and a pacer burst of 2 ms at
// the dilated line rate, at most 64 KiB.
func TestCongestionFor(t *testing.T) {
	for _, c := range []struct {
		args     []string
		on       bool
		lineMbps float64
		burst    int
		scale    float64
		profile  string
	}{
		{[]string{"--dcqcn", "paper", "--dcqcn-scale", "400"}, true, 100, 25000, 400, "paper"},
		{[]string{"--dcqcn", "paper"}, true, 40000, 64 << 10, 1, "paper"},
		{[]string{"--dcqcn", "connectx", "--dcqcn-scale", "1000"}, true, 100, 25000, 1000, "connectx"},
		{[]string{"--cc", "dcqcn", "--cc-scale", "1000"}, true, 100, 25000, 1000, "connectx"},
		{[]string{"--cc", "swift", "--cc-scale", "400"}, true, 100, 25000, 400, "default"},
		{[]string{"--cc", "timely:paper", "--dcqcn-scale", "400"}, true, 100, 25000, 400, "paper"},
		{nil, false, 0, 0, 0, ""},
		{[]string{"--cc", "off"}, false, 0, 0, 0, ""},
	} {
		p, err := perftest.ParseArgs(perftest.Write, perftest.BW, append([]string{"-d", "x"}, c.args...))
		if err != nil {
			t.Fatal(err)
		}
		cc, err := CongestionFor(p)
		if err != nil {
			t.Fatal(err)
		}
		if cc.On() != c.on || cc.Profile != c.profile || cc.PacerBurst != c.burst || c.on && (cc.Scale != c.scale || float64(cc.LineRate())/1e6 != c.lineMbps) {
			t.Errorf("%q: got %s on=%v scale %v line %v burst %d, want %s %v %v %v Mb/s %d", c.args, cc.Profile, cc.On(), cc.Scale,
				float64(cc.LineRate())/1e6, cc.PacerBurst, c.profile, c.on, c.scale, c.lineMbps, c.burst)
		}
	}
}

// TestEngineOptions: the engine naps longer only under dilation, S × its
// default, at most 250 µs; otherwise it keeps the tuned defaults.
func TestEngineOptions(t *testing.T) {
	for _, c := range []struct {
		args []string
		nap  time.Duration
	}{
		{nil, 0},
		{[]string{"--dcqcn", "paper"}, 0},
		{[]string{"--dcqcn", "paper", "--dcqcn-scale", "4"}, 40 * time.Microsecond},
		{[]string{"--dcqcn", "connectx", "--dcqcn-scale", "400"}, 250 * time.Microsecond},
		{[]string{"--dcqcn", "off", "--dcqcn-scale", "400"}, 0},
	} {
		p, err := perftest.ParseArgs(perftest.Write, perftest.BW, append([]string{"-d", "x"}, c.args...))
		if err != nil {
			t.Fatal(err)
		}
		cc, err := CongestionFor(p)
		if err != nil {
			t.Fatal(err)
		}
		if o := engineOptions(cc); o.IdleWait != c.nap || o.SpinFor != 0 || o.DeepIdleAfter != 0 {
			t.Errorf("%q: options %+v, want IdleWait %v and the rest default", c.args, o, c.nap)
		}
	}
}

// TestSwiftJSON runs write_bw with Swift: both --json outputs carry the
// "cc" object (algorithm, profile, scale, the device's cc_* counters, the
// QP's figures) and no "dcqcn" one; the client's QP took RTT samples from
// the ACKs and has a window. Dilated by 400 (a 100 Mb/s line rate, a
// target of milliseconds), so that the real RTT of two engines on a busy
// host stays below the target.
func TestSwiftJSON(t *testing.T) {
	args := []string{"-s", "65536", "-n", "20", "--json", "--cc", "swift", "--cc-scale", "400"}
	a, b := ccHosts(t, args, 0)
	sout, cout := runPairJSON(t, a, b, args...)
	var got []CCJSON
	for _, out := range []string{sout, cout} {
		var v struct {
			CC    *CCJSON    `json:"cc"`
			DCQCN *DCQCNJSON `json:"dcqcn"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil || v.CC == nil || v.DCQCN != nil {
			t.Fatalf("%v: want a cc object and no dcqcn one in\n%s", err, out)
		}
		c := *v.CC
		if c.Algorithm != "swift" || c.Profile != "default" || c.Scale != 400 || len(c.QPs) != 1 || c.RTTSamples == nil ||
			c.Decreases == nil || c.LossEvents == nil || c.WindowFull == nil || c.Peer == "" {
			t.Fatalf("cc object %+v", c)
		}
		got = append(got, c)
	}
	cq := got[1].QPs[0]
	if *got[1].RTTSamples == 0 || cq.RTTSamples == 0 || cq.SRTTUs <= 0 || cq.MinRTTUs <= 0 || cq.WindowBytes == nil ||
		*cq.WindowBytes <= 0 || cq.Cwnd <= 0 || cq.TargetUs <= 0 || cq.RateMbps <= 0 {
		t.Errorf("client QP %+v (device samples %d)", cq, *got[1].RTTSamples)
	}
}
