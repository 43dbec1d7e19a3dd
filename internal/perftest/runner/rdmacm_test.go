package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/frame/frametest"
	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/internal/perftest"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// cmAgent runs an rdmacm agent on h's device (of this process) until the
// test ends.
func cmAgent(t *testing.T, h Host) *rdmacm.Agent {
	t.Helper()
	dev := h.Device.(*rnic.Device)
	a, err := rdmacm.New(rdmacm.Config{Device: dev, Resolve: dev.Config().Resolve})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// runCMPair runs one -R test between a server on host s and a client on
// host c, through their CMs, and returns both results.
func runCMPair(t *testing.T, s, c Host, port uint16, verb perftest.Verb, m perftest.Measure, args ...string) (sr, cr Result) {
	t.Helper()
	sr, cr, _ = runCMThrough(t, s, c, port, 0, verb, m, args...)
	return sr, cr
}

// runCMThrough runs one -R test between a server on host s and a client
// on host c, through their CMs (Host.CM); the server starts listening on
// port after delay (in rdma_cm's UDP port space too for -c UD).
func runCMThrough(t *testing.T, s, c Host, port uint16, delay time.Duration, verb perftest.Verb, m perftest.Measure, args ...string) (sr, cr Result, cout string) {
	t.Helper()
	args = append([]string{"-R", "-p", fmt.Sprint(port)}, args...)
	ps, err := perftest.ParseArgs(verb, m, args)
	if err != nil {
		t.Fatal(err)
	}
	pc := ps
	pc.Host = s.Iface.GIDs[0].String()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var sout, cb bytes.Buffer
	serr := make(chan error, 1)
	go func() {
		time.Sleep(delay)
		ss := &cmSession{cm: s.CM, port: port}
		var err error
		if ss.l, err = s.CM.Listen(port, 0); err != nil {
			serr <- err
			return
		}
		defer ss.l.Close()
		if ps.Transport == perftest.UD {
			if ss.udl, err = s.CM.ListenUD(port, 16); err != nil {
				serr <- err
				return
			}
			defer ss.udl.Close()
		}
		sr, err = New(s, ps, false, &sout).execCM(ctx, ss)
		serr <- err
	}()
	cr, cerr := New(c, pc, true, &cb).execCM(ctx, &cmSession{cm: c.CM, peer: s.Iface.GIDs[0], port: port, dialFor: 3 * time.Second})
	if cerr != nil {
		cancel()
	}
	if err := <-serr; err != nil || cerr != nil {
		t.Fatalf("server: %v\nclient: %v\nserver output: %s\nclient output: %s", err, cerr, sout.String(), cb.String())
	}
	return sr, cr, cb.String()
}

// wireShape reduces a capture of a -R write_bw to what the two perftests
// say to each other, in order: the CM MADs and the control SENDs (with
// their payloads, pingpong_dest records masked as in the perftest
// package's test, 8-byte report values reduced to their length), each
// marked c (client) or s (server). Data WRITEs and ACKs are left out.
// After the first DREQ only the CM messages' kinds are kept, in a
// separate list, since who disconnects what first is a race. A control
// SEND sent again (adaptive retransmission repeats one whose ACK was
// merely late, as happens on a loaded host) is the same message: it is
// counted once.
func wireShape(t *testing.T, frames [][]byte) (shape, teardown []string) {
	t.Helper()
	var client netip.Addr
	tearing := false
	type sent struct {
		src netip.Addr
		qpn uint32
		psn uint32
	}
	seen := map[sent]bool{}
	for _, fb := range frames {
		var f frame.Frame
		if err := frame.Parse(fb, &f); err != nil {
			continue // ARP, neighbour discovery
		}
		if !f.VerifyICRC() {
			t.Fatalf("frame with a bad ICRC")
		}
		var item string
		switch {
		case f.Opcode() == bth.UDSendOnly && f.BTH().DestQP() == 1:
			mad, err := cm.ParseMAD(f.Payload())
			if err != nil {
				t.Fatalf("QP1 frame: %v", err)
			}
			if mad.AttrID() == cm.AttrREQ && !client.IsValid() {
				client = f.Src()
			}
			item = fmt.Sprintf("%v", mad.AttrID())
			// What the applications put in the conn_param: READ
			// resources, retry counts, user private data (the rdma_cm
			// header of a REQ holds ports and addresses: skipped).
			switch mad.AttrID() {
			case cm.AttrREQ:
				var r cm.REQ
				r.Decode(mad.Data())
				item += fmt.Sprintf(" resp %d init %d retry %d rnr %d mtu %d private %x", r.ResponderResources, r.InitiatorDepth,
					r.RetryCount, r.RNRRetryCount, r.PathMTU, r.PrivateData[cm.CMAHeaderSize:])
			case cm.AttrREP:
				var r cm.REP
				r.Decode(mad.Data())
				item += fmt.Sprintf(" resp %d init %d rnr %d private %x", r.ResponderResources, r.InitiatorDepth, r.RNRRetryCount, r.PrivateData)
			}
			if mad.AttrID() == cm.AttrDREQ {
				tearing = true
			}
		case f.Opcode() == bth.RCSendOnly:
			k := sent{f.Src(), f.BTH().DestQP(), uint32(f.BTH().PSN())}
			if seen[k] {
				continue
			}
			seen[k] = true
			p := f.Payload()
			switch len(p) {
			case perftest.CMDestSize:
				m := append([]byte(nil), p...)
				clear(m[8:24])
				clear(m[24:48])
				clear(m[52:56])
				item = fmt.Sprintf("SEND %x", m)
			case 8:
				item = "SEND 8 bytes"
			default:
				item = fmt.Sprintf("SEND %x", p)
			}
		default:
			continue
		}
		side := "s"
		if f.Src() == client {
			side = "c"
		}
		if tearing {
			if !strings.HasPrefix(item, "SEND") {
				teardown = append(teardown, item)
			}
			continue
		}
		shape = append(shape, side+" "+item)
	}
	return shape, teardown
}

// TestCMWireMatchesCapture runs our -R write_bw server and client over an
// in-memory link, captures the server's frames, and checks that the
// conversation on the wire is stock perftest's (write_bw_rdmacm.pcap, the
// same command between two rxe hosts): REQ/REP/RTU of the control QP,
// version, page size, cache line, MTU and the zero records as control
// SENDs, the second REQ/REP/RTU for the test QP, the records, the
// barriers, the reports and the closing handshake, message for message and
// byte for byte modulo QPN, PSN, rkey, vaddr, GID and measured figures; and
// that both connections end with DREQ/DREP.
func TestCMWireMatchesCapture(t *testing.T) {
	ref, err := frametest.ReadFile(filepath.Join(frametest.VectorsDir(t), "write_bw_rdmacm.pcap"))
	if err != nil {
		t.Skipf("reference capture not available: %v", err)
	}
	want, wantDown := wireShape(t, ref)
	var tap capture.Tap
	a, b := memlinkHostsTap(t, 1500, &tap)
	var file bytes.Buffer
	sess, err := tap.Start(&file, capture.Options{Format: capture.PCAP})
	if err != nil {
		t.Fatal(err)
	}
	runCMPair(t, a, b, 18523, perftest.Write, perftest.BW, "-s", "4096", "-n", "50", "--verify")
	// Both ends' Disconnect waited for the DREPs: the teardown is
	// complete in the capture once Stop has flushed it.
	if _, err := sess.Stop(); err != nil {
		t.Fatal(err)
	}
	frames, err := frametest.Read(&file)
	if err != nil {
		t.Fatal(err)
	}
	got, gotDown := wireShape(t, frames)
	t.Logf("%d CM messages and control SENDs before the teardown (stock perftest %d); teardown %v; first: %.80s", len(got), len(want), gotDown, got[0])
	if len(got) != len(want) {
		t.Errorf("%d messages before the first DREQ, stock perftest %d", len(got), len(want))
	}
	for i := 0; i+1 < min(len(got), len(want)); i++ {
		// Our agent wakes Dial before it posts the RTU, so the client's
		// first SEND on a new connection can overtake its RTU (the server
		// takes the SEND as COMM_EST; rxe accepts it the same way): that
		// one swap is tolerated, and logged.
		if got[i] != want[i] && got[i] == want[i+1] && got[i+1] == want[i] && (got[i] == "c RTU" || got[i+1] == "c RTU") {
			t.Logf("message %d: %q overtook %q", i, got[i], got[i+1])
			got[i], got[i+1] = got[i+1], got[i]
		}
	}
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			t.Errorf("message %d:\n got  %s\n want %s", i, got[i], want[i])
		}
	}
	if countOf(wantDown, "DREQ") != 2 || countOf(wantDown, "DREP") != 2 {
		t.Fatalf("reference teardown %v", wantDown)
	}
	// Each connection ends with a DREQ answered by a DREP, or with two
	// crossed DREQs: a side that meets its peer's DREQ while its own is
	// out answers with a DREP and returns, and that DREP may leave after
	// the capture stopped.
	dreq, drep := countOf(gotDown, "DREQ"), countOf(gotDown, "DREP")
	if dreq < 2 || dreq+drep < 4 || countOf(gotDown, "REJ") != 0 {
		t.Errorf("teardown %v, want for each of the two connections a DREQ and a DREP, or two crossed DREQs", gotDown)
	}
}

func countOf(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

// TestCMOverMemlink runs read_bw and send_bw -R with --verify over an
// in-memory link (no root needed): READ resources negotiated in the CM,
// receives posted before the peer's SENDs.
func TestCMOverMemlink(t *testing.T) {
	a, b := memlinkHosts(t)
	port := uint16(18700)
	for _, tc := range []struct {
		verb perftest.Verb
		args []string
	}{
		{perftest.Read, []string{"-s", "8192", "-n", "100", "-q", "2"}},
		{perftest.Send, []string{"-s", "1000", "-n", "200"}},
	} {
		port++
		sr, cr := runCMPair(t, a, b, port, tc.verb, perftest.BW, append(tc.args, "--verify")...)
		if !sr.Verify || !cr.Verify || len(cr.BW) != 1 || cr.BW[0].Iters == 0 {
			t.Errorf("%v: server %+v client %+v", tc.verb, sr, cr)
		}
	}
}

// memFailDevice is an RNIC whose AllocMem fails.
type memFailDevice struct{ *rnic.Device }

func (memFailDevice) AllocMem(int) (verbs.Mem, error) { return nil, verbs.ErrNotSupported }

// TestCMChannelSetupFails: a control channel whose setup fails half way
// returns the error (and releases what it made) instead of panicking.
func TestCMChannelSetupFails(t *testing.T) {
	dev, err := rnic.NewDevice(rnic.Config{MAC: [6]byte{2, 0, 0, 0, 0, 1}, Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := newCMChannel(memFailDevice{dev})
	if ch != nil || !errors.Is(err, verbs.ErrNotSupported) {
		t.Fatalf("newCMChannel: %v, %v; want nil, ErrNotSupported", ch, err)
	}
}
