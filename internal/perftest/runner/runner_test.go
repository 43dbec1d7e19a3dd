package runner

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/frame/frametest"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/internal/perftest"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
)

// startDevice creates the device of in (resolving peers with resolve)
// and runs it on p until the test ends.
func startDevice(t *testing.T, in host.Interface, p port.Port, opt engine.Options, resolve func(context.Context, netip.Addr) ([6]byte, error)) *rnic.Device {
	t.Helper()
	dev, err := host.NewDevice(in, host.DeviceOptions{Resolve: resolve})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- engine.Run(ctx, dev, p, opt) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("engine: %v", err)
		}
	})
	return dev
}

// memlinkHosts returns two hosts joined by an in-memory link, each with
// its rdma_cm agent.
func memlinkHosts(t *testing.T) (a, b Host) {
	return memlinkHostsTap(t, 1500, nil)
}

// memlinkHostsTap is memlinkHosts with a capture tap on a's engine.
func memlinkHostsTap(t *testing.T, mtu int, tap *capture.Tap) (a, b Host) {
	pa, pb := memlink.NewPair(memlink.Config{MaxFrame: mtu + 200})
	t.Cleanup(func() { pa.Close(); pb.Close() })
	ia := host.Interface{Name: "mla", MTU: mtu, MAC: [6]byte{2, 0, 0, 0, 0, 0xa}, GIDs: []netip.Addr{netip.MustParseAddr("10.7.0.1")}}
	ib := host.Interface{Name: "mlb", MTU: mtu, MAC: [6]byte{2, 0, 0, 0, 0, 0xb}, GIDs: []netip.Addr{netip.MustParseAddr("10.7.0.2")}}
	resolver := func(peer host.Interface) func(context.Context, netip.Addr) ([6]byte, error) {
		return func(_ context.Context, a netip.Addr) ([6]byte, error) {
			if a != peer.GIDs[0] {
				return [6]byte{}, fmt.Errorf("no route to %v", a)
			}
			return peer.MAC, nil
		}
	}
	a = Host{Device: startDevice(t, ia, pa, engine.Options{Tap: tap}, resolver(ib)), Iface: ia}
	b = Host{Device: startDevice(t, ib, pb, engine.Options{}, resolver(ia)), Iface: ib}
	a.CM, b.CM = cmAgent(t, a), cmAgent(t, b)
	return a, b
}

// runPair runs one test between a server on host s and a client on host c
// over loopback TCP and returns both results and outputs.
func runPair(t *testing.T, s, c Host, verb perftest.Verb, m perftest.Measure, args ...string) (sr, cr Result, sout, cout string) {
	t.Helper()
	ps, err := perftest.ParseArgs(verb, m, args)
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
	var wg sync.WaitGroup
	var serr, cerr error
	var sbuf, cbuf bytes.Buffer
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := ln.Accept()
		if err != nil {
			serr = err
			return
		}
		defer conn.Close()
		sr, serr = New(s, ps, false, &sbuf).Exec(ctx, conn)
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cr, cerr = New(c, pc, true, &cbuf).Exec(ctx, conn)
	conn.Close()
	wg.Wait()
	if serr != nil || cerr != nil {
		t.Fatalf("server: %v\nclient: %v\nserver output:\n%s\nclient output:\n%s", serr, cerr, sbuf.String(), cbuf.String())
	}
	return sr, cr, sbuf.String(), cbuf.String()
}

// TestEveryProgramOverMemlink runs all eight programs with --verify between
// two engines joined by an in-memory link.
func TestEveryProgramOverMemlink(t *testing.T) {
	a, b := memlinkHosts(t)
	for _, tc := range []struct {
		verb perftest.Verb
		m    perftest.Measure
		args []string
	}{
		{perftest.Write, perftest.BW, []string{"-s", "65536", "-n", "40", "-q", "2"}},
		{perftest.Read, perftest.BW, []string{"-s", "8192", "-n", "40"}},
		{perftest.Send, perftest.BW, []string{"-s", "4096", "-n", "100", "-r", "64"}},
		{perftest.Atomic, perftest.BW, []string{"-n", "100"}},
		{perftest.Write, perftest.Latency, []string{"-s", "64", "-n", "300"}}, // the marker wraps at 256
		{perftest.Write, perftest.Latency, []string{"-s", "1", "-n", "20"}},
		{perftest.Read, perftest.Latency, []string{"-s", "64", "-n", "50"}},
		{perftest.Send, perftest.Latency, []string{"-s", "64", "-n", "50"}},
		{perftest.Atomic, perftest.Latency, []string{"-n", "50"}},
		{perftest.Write, perftest.BW, []string{"-a", "-n", "5", "-c", "UC"}},
		{perftest.Send, perftest.BW, []string{"-s", "2000", "-n", "50", "-c", "UC", "-r", "64"}},
		{perftest.Send, perftest.BW, []string{"-s", "1024", "-n", "200", "-c", "UD", "-r", "256"}},
		{perftest.Send, perftest.BW, []string{"-a", "-n", "20", "-c", "UD", "-r", "64"}},
		{perftest.Send, perftest.Latency, []string{"-s", "64", "-n", "50", "-c", "UD"}},
		{perftest.Write, perftest.BW, []string{"-s", "65536", "-D", "1", "-q", "2"}},
	} {
		test := perftest.Test{Verb: tc.verb, Measure: tc.m}
		t.Run(test.Name()+"/"+strings.Join(tc.args, ""), func(t *testing.T) {
			args := append([]string{"--verify"}, tc.args...)
			sr, cr, sout, cout := runPair(t, a, b, tc.verb, tc.m, args...)
			if !sr.Verify || !cr.Verify || sr.MTU != 1024 {
				t.Errorf("verify server %v client %v, MTU %d", sr.Verify, cr.Verify, sr.MTU)
			}
			if tc.m == perftest.BW {
				if len(cr.BW) == 0 || cr.BW[0].AvgBW <= 0 || cr.BW[0].Iters == 0 {
					t.Fatalf("client BW %+v\n%s", cr.BW, cout)
				}
				if !strings.Contains(cout, "BW average[MiB/sec]") {
					t.Errorf("client output:\n%s", cout)
				}
			} else {
				if len(cr.Lat) != 1 || cr.Lat[0].Typical <= 0 {
					t.Fatalf("client latency %+v\n%s", cr.Lat, cout)
				}
			}
			if !strings.Contains(sout, "local address: LID 0000 QPN") || !strings.Contains(sout, "remote address") {
				t.Errorf("server output:\n%s", sout)
			}
		})
	}
}

// TestVerifyCatchesCorruption makes the peer's memory wrong and checks that
// --verify notices rather than passing whatever arrives.
func TestVerifyCatchesCorruption(t *testing.T) {
	if err := checkPattern([]byte{pattern(0, 0, true), pattern(0, 1, true) ^ 1}, 0, 0, true); err == nil {
		t.Fatal("corrupted byte passed")
	}
	if err := checkPattern([]byte{pattern(1, 5, false)}, 1, 5, false); err != nil {
		t.Fatal(err)
	}
	if pattern(0, 7, true) == pattern(0, 7, false) {
		t.Fatal("client and server patterns must differ, or a READ of our own data would pass")
	}
}

// TestUDFramesAsPerftest captures a UD send_lat between two devices and
// checks its frames as a stock peer would see them: UD SEND ONLY with
// perftest's Q_Key, the source QP and the UDP source port rxe derives from
// it, and a valid ICRC; the receiver's completions (checked by the run)
// count the 40-byte GRH slot.
func TestUDFramesAsPerftest(t *testing.T) {
	var tap capture.Tap
	a, b := memlinkHostsTap(t, 1500, &tap)
	var file bytes.Buffer
	sess, err := tap.Start(&file, capture.Options{Format: capture.PCAP})
	if err != nil {
		t.Fatal(err)
	}
	runPair(t, a, b, perftest.Send, perftest.Latency, "-c", "UD", "-s", "100", "-n", "20", "--verify")
	if _, err := sess.Stop(); err != nil {
		t.Fatal(err)
	}
	frames, err := frametest.Read(&file)
	if err != nil {
		t.Fatal(err)
	}
	in, out := 0, 0
	for _, fb := range frames {
		var f frame.Frame
		if err := frame.Parse(fb, &f); err != nil || !f.VerifyICRC() {
			t.Fatalf("frame: %v", err)
		}
		d := f.DETH()
		if f.Opcode() != bth.UDSendOnly || d == nil || d.QKey() != udQKey {
			t.Fatalf("opcode %v, DETH %v", f.Opcode(), d != nil)
		}
		if got, want := f.UDP().SrcPort(), rnic.UDSourcePort(d.SrcQP()); got != want {
			t.Errorf("UDP source port %#x, want %#x for QP %#x", got, want, d.SrcQP())
		}
		if len(f.Payload()) != 100 {
			t.Errorf("payload %d bytes", len(f.Payload()))
		}
		if f.Src() == a.Iface.GIDs[0] {
			out++
		} else {
			in++
		}
	}
	if in != 20 || out != 20 {
		t.Errorf("captured %d frames in and %d out, want 20 each", in, out)
	}
}
