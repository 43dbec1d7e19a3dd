package rping

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/frame/frametest"
	"github.com/softrnic/softrnic/internal/checker"
	cmrping "github.com/softrnic/softrnic/internal/cm/rping"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
)

// runEngine drives a device on a port until ctx ends. The engine loop may
// move from daemon to engine: this is the one place to change.
func runEngine(ctx context.Context, dev *rnic.Device, p port.Port) error {
	return engine.Run(ctx, dev, p, engine.Options{})
}

// tapPort keeps a copy of every frame sent.
type tapPort struct {
	port.Port
	mu     sync.Mutex
	frames [][]byte
}

func (t *tapPort) Submit(frames [][]byte) (int, error) {
	n, err := t.Port.Submit(frames)
	t.mu.Lock()
	for _, f := range frames[:n] {
		t.frames = append(t.frames, append([]byte(nil), f...))
	}
	t.mu.Unlock()
	return n, err
}

var (
	ipS, ipC   = netip.MustParseAddr("10.77.0.11"), netip.MustParseAddr("10.77.0.10")
	macS, macC = [6]byte{2, 0, 0, 0, 0x77, 11}, [6]byte{2, 0, 0, 0, 0x77, 10}
)

// setup starts a server and a client device on a real-time memlink with
// the CM's default timers (those of the stock tools), the client's frames
// tapped.
func setup(t *testing.T) (srv, cli *rdmacm.Agent, tap *tapPort) {
	srv, cli, tap, _ = setup2(t)
	return
}

// setup2 is setup with the server's frames tapped too.
func setup2(t *testing.T) (srv, cli *rdmacm.Agent, tap, tapS *tapPort) {
	la, lb := memlink.NewPair(memlink.Config{Seed: 3})
	tap = &tapPort{Port: lb}
	tapS = &tapPort{Port: la}
	macs := map[netip.Addr][6]byte{ipS: macS, ipC: macC}
	resolve := func(_ context.Context, peer netip.Addr) ([6]byte, error) {
		if m, ok := macs[peer]; ok {
			return m, nil
		}
		return [6]byte{}, errors.New("no neighbour")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	mk := func(mac [6]byte, ip netip.Addr, p port.Port) *rdmacm.Agent {
		dev, err := rnic.NewDevice(rnic.Config{MAC: mac, Addrs: []netip.Addr{ip}})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := runEngine(ctx, dev, p); err != nil && !errors.Is(err, context.Canceled) {
				t.Error(err)
			}
		}()
		a, err := rdmacm.New(rdmacm.Config{Device: dev, Resolve: resolve})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	srv, cli = mk(macS, ipS, tapS), mk(macC, ipC, tap)
	t.Cleanup(func() {
		srv.Close()
		cli.Close()
		cancel()
		wg.Wait()
	})
	return srv, cli, tap, tapS
}

func run(srv, cli *rdmacm.Agent, o Options) (string, string, error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sout, cout bytes.Buffer
	so, co := o, o
	so.Out, co.Out = &sout, &cout
	ready := make(chan struct{})
	serr := make(chan error, 1)
	go func() { serr <- Server(ctx, srv, so, func() { close(ready) }) }()
	<-ready
	cerr := Client(ctx, cli, ipS, co)
	if cerr != nil {
		cancel()
	}
	return sout.String(), cout.String(), <-serr, cerr
}

// TestPing: ten 64-byte pings with -V -v; both sides print rping's lines
// and the data comes back intact; then the same with a larger buffer
// (several MTUs: multi-packet READ responses and WRITEs).
func TestPing(t *testing.T) {
	srv, cli, _ := setup(t)
	for _, size := range []int{64, 5000} {
		sout, cout, serr, cerr := run(srv, cli, Options{Count: 10, Size: size, Verbose: true, Validate: true})
		if serr != nil || cerr != nil {
			t.Fatalf("size %d: server %v, client %v\n%s\n%s", size, serr, cerr, sout, cout)
		}
		lines := strings.Split(strings.TrimSpace(cout), "\n")
		if len(lines) != 10 || strings.Count(sout, "server ping data: ") != 10 {
			t.Fatalf("size %d: client printed %d lines, server %d", size, len(lines), strings.Count(sout, "\n"))
		}
		want := make([]byte, size)
		for i, l := range lines {
			cmrping.FillPing(want, i)
			if l != "ping data: "+string(want[:size-1]) {
				t.Fatalf("ping %d: %q", i, l)
			}
		}
	}
}

// TestBadSize: sizes rping refuses.
func TestBadSize(t *testing.T) {
	for _, s := range []int{1, 25, 65536} {
		o := Options{Size: s}
		if o.norm() == nil {
			t.Errorf("size %d accepted", s)
		}
	}
}

// capturedREQ finds the first REQ MAD and the first RC SEND payload of a
// set of frames.
func capturedREQ(frames [][]byte) (req cm.REQ, send []byte, ok bool) {
	found := false
	for _, b := range frames {
		var f frame.Frame
		if frame.Parse(b, &f) != nil {
			continue // ARP, neighbour discovery
		}
		p := checker.Decode(checker.TransportOf(&f))
		if p.DestQP == 1 {
			if p.Op != bth.UDSendOnly || len(p.Payload) < cm.MADSize {
				continue
			}
			mad := cm.MAD(p.Payload[:cm.MADSize])
			if mad.AttrID() == cm.AttrREQ && !found {
				req.Decode(mad.Data())
				found = true
			}
			continue
		}
		if p.Op == bth.RCSendOnly && send == nil {
			send = p.Payload
		}
	}
	return req, send, found && send != nil
}

// TestMatchesStockRping: our client's REQ and first SEND against those of
// `rping -c -a 10.77.0.11 -C 10 -S 64 -v` recorded from rxe
// (shared/vectors/rping.pcap): every field equal except the ones that are
// per connection (comm ID, CA GUID, QPN, PSN, addresses, rdma_cm port and
// the flow label derived from it, buffer address and rkey).
func TestMatchesStockRping(t *testing.T) {
	stock := readPcap(t, "rping.pcap")
	want, wantSend, ok := capturedREQ(stock)
	if !ok {
		t.Fatal("no REQ/SEND in the capture")
	}

	srv, cli, tap := setup(t)
	if _, _, serr, cerr := run(srv, cli, Options{Count: 10, Size: 64, Verbose: true, Validate: true}); serr != nil || cerr != nil {
		t.Fatalf("server %v, client %v", serr, cerr)
	}
	tap.mu.Lock()
	got, gotSend, ok := capturedREQ(tap.frames)
	tap.mu.Unlock()
	if !ok {
		t.Fatal("no REQ/SEND sent")
	}
	wh, _ := cm.DecodeCMAHeader(want.PrivateData[:])
	gh, err := cm.DecodeCMAHeader(got.PrivateData[:])
	if err != nil || gh.Version != wh.Version || gh.Src != ipC || gh.Dst != ipS {
		t.Fatalf("cma header %+v (%v), stock %+v", gh, err, wh)
	}
	if got.Primary.FlowLabel != (uint32(gh.SrcPort)*31+7174)&0xFFFFF ||
		want.Primary.FlowLabel != (uint32(wh.SrcPort)*31+7174)&0xFFFFF {
		t.Errorf("flow label %#x for port %d (stock %#x for %d)", got.Primary.FlowLabel, gh.SrcPort, want.Primary.FlowLabel, wh.SrcPort)
	}
	if got.Primary.LocalGID != cm.GIDFromAddr(ipC) || got.Primary.RemoteGID != cm.GIDFromAddr(ipS) {
		t.Errorf("GIDs %v %v", got.Primary.LocalGID, got.Primary.RemoteGID)
	}
	// Blank what differs per connection, then the rest must be equal.
	for _, q := range []*cm.REQ{&want, &got} {
		q.LocalCommID, q.LocalCAGUID, q.LocalQPN, q.StartingPSN = 0, 0, 0, 0
		q.Primary.LocalGID, q.Primary.RemoteGID, q.Primary.FlowLabel = cm.GID{}, cm.GID{}, 0
		clear(q.PrivateData[:cm.CMAHeaderSize])
	}
	if got != want {
		t.Errorf("REQ differs from stock rping's:\n got %+v\nwant %+v", got, want)
	}
	// The first SEND: {start buf, rkey, size 64}; buf and rkey per run.
	if len(gotSend) != 16 || len(wantSend) != 16 || !bytes.Equal(gotSend[12:], wantSend[12:]) {
		t.Errorf("first SEND % x, stock % x", gotSend, wantSend)
	}
}

// psnCheck returns, from the frames of a connection, the Starting PSNs of
// the REQ and REP and the first PSNs the client (SEND) and the server
// (RDMA READ request) sent from.
func psnCheck(frames [][]byte) (req, rep, cliSend, srvRead uint32, ok bool) {
	var seen [4]bool
	for _, b := range frames {
		var f frame.Frame
		if frame.Parse(b, &f) != nil {
			continue // ARP, neighbour discovery
		}
		p := checker.Decode(checker.TransportOf(&f))
		psn := uint32(p.PSN)
		switch {
		case p.Op == bth.UDSendOnly && p.DestQP == 1 && len(p.Payload) >= cm.MADSize:
			mad := cm.MAD(p.Payload[:cm.MADSize])
			switch mad.AttrID() {
			case cm.AttrREQ:
				var m cm.REQ
				m.Decode(mad.Data())
				req, seen[0] = m.StartingPSN, true
			case cm.AttrREP:
				var m cm.REP
				m.Decode(mad.Data())
				rep, seen[1] = m.StartingPSN, true
			}
		case p.Op == bth.RCSendOnly && !seen[2]:
			cliSend, seen[2] = psn, true
		case p.Op == bth.RCRDMAReadRequest && !seen[3]:
			srvRead, seen[3] = psn, true
		}
	}
	return req, rep, cliSend, srvRead, seen == [4]bool{true, true, true, true}
}

// TestPSNsAsLinux: each side sends from the Starting PSN of the peer's CM
// message, as the Linux CM programs QPs (rping.pcap shows it between two
// rxe hosts); a kernel peer drops everything otherwise.
func TestPSNsAsLinux(t *testing.T) {
	stock := readPcap(t, "rping.pcap")
	req, rep, send, read, ok := psnCheck(stock)
	if !ok || send != rep || read != req {
		t.Fatalf("capture: REQ %#x REP %#x, client SEND %#x, server READ %#x", req, rep, send, read)
	}
	srv, cli, tapC, tapS := setup2(t)
	if _, _, serr, cerr := run(srv, cli, Options{Count: 1, Size: 64, Validate: true}); serr != nil || cerr != nil {
		t.Fatalf("server %v, client %v", serr, cerr)
	}
	tapC.mu.Lock()
	tapS.mu.Lock()
	frames := append(append([][]byte(nil), tapC.frames...), tapS.frames...)
	tapS.mu.Unlock()
	tapC.mu.Unlock()
	req, rep, send, read, ok = psnCheck(frames)
	if !ok || send != rep || read != req {
		t.Fatalf("softrnic: REQ %#x REP %#x, client SEND %#x, server READ %#x", req, rep, send, read)
	}
}

// readPcap returns the frames of a shared capture (the test is skipped
// without it).
func readPcap(t *testing.T, name string) [][]byte {
	f, err := os.Open(filepath.Join(frametest.VectorsDir(t), name))
	if err != nil {
		t.Skipf("capture not available: %v", err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, data)
	}
}
