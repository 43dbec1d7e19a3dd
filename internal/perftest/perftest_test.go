package perftest

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

func TestRecordFormat(t *testing.T) {
	// The example record of the research notes, whose length was checked
	// against perftest's KEY_MSG_SIZE_GID.
	const want = "0000:0010:00c05d:3a7f1c:00002001:00007f1234560000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:02:00000000:\x00"
	d := Dest{OutReads: 0x10, QPN: 0xc05d, PSN: 0x3a7f1c, RKey: 0x2001, VAddr: 0x7f1234560000,
		GID: GIDFromAddr(netip.MustParseAddr("10.0.0.2"))}
	b, err := d.AppendRecord(nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want || len(b) != KeyRecordSize {
		t.Fatalf("record\n got %q\nwant %q", b, want)
	}
	back, err := ParseRecord(b)
	if err != nil || back != d {
		t.Fatalf("parse: %+v %v", back, err)
	}
	if a := back.Addr(); a != netip.MustParseAddr("10.0.0.2") || !IsV4Mapped(back.GID) {
		t.Errorf("Addr %v", a)
	}
	v6 := Dest{QPN: 0xffffff, PSN: 1, RKey: 0xffffffff, VAddr: ^uint64(0), SRQN: 7, LID: 0xffff, OutReads: 0xffff,
		GID: GIDFromAddr(netip.MustParseAddr("fd77::11"))}
	b, _ = v6.AppendRecord(nil)
	if back, err := ParseRecord(b); err != nil || back != v6 || IsV4Mapped(back.GID) {
		t.Fatalf("v6 round trip: %+v %v", back, err)
	}
	if _, err := (Dest{QPN: 1 << 24}).AppendRecord(nil); err == nil {
		t.Error("25-bit QPN accepted")
	}
	if _, err := (Dest{PSN: 1 << 24}).AppendRecord(nil); err == nil {
		t.Error("25-bit PSN accepted")
	}
}

func TestParseRecordRejects(t *testing.T) {
	good, _ := Dest{QPN: 0x11, PSN: 0x123456}.AppendRecord(nil)
	cases := map[string][]byte{
		"short":        good[:KeyRecordSize-1],
		"long":         append(append([]byte(nil), good...), 0),
		"no NUL":       append(bytes.Clone(good[:KeyRecordSize-1]), ':'),
		"not hex":      bytes.Replace(bytes.Clone(good), []byte("000011"), []byte("00001g"), 1),
		"empty field":  bytes.Replace(bytes.Clone(good), []byte("0000:"), []byte(":0000"), 1),
		"NUL early":    bytes.Replace(bytes.Clone(good), []byte("0000:"), []byte("0000\x00"), 1),
		"25-bit QPN":   []byte(strings.Replace(string(good), "0000:0000:000011:", "0000:000:1000011:", 1)),
		"all colons":   bytes.Repeat([]byte{':'}, KeyRecordSize),
		"all NUL":      make([]byte, KeyRecordSize),
		"GID byte 100": bytes.Replace(bytes.Clone(good), []byte(":00:00:00000000:"), []byte(":00:100:0000000:"), 1),
	}
	for name, rec := range cases {
		if d, err := ParseRecord(rec); err == nil {
			t.Errorf("%s: accepted as %+v", name, d)
		}
	}
}

func FuzzParseRecord(f *testing.F) {
	good, _ := Dest{QPN: 0x11, PSN: 0x123456, GID: GIDFromAddr(netip.MustParseAddr("10.77.0.10"))}.AppendRecord(nil)
	f.Add(good)
	f.Fuzz(func(t *testing.T, rec []byte) {
		d, err := ParseRecord(rec)
		if err != nil {
			return
		}
		// Whatever parses must format back to a record that parses the same.
		b, err := d.AppendRecord(nil)
		if err != nil {
			t.Fatalf("parsed %+v does not format: %v", d, err)
		}
		if back, err := ParseRecord(b); err != nil || back != d {
			t.Fatalf("round trip %+v → %+v %v", d, back, err)
		}
	})
}

// rwPair is an in-memory full-duplex stream with buffered writes, so that
// both ends may write before reading (as they do for "done").
type rwPair struct {
	r *bytes.Buffer
	w *bytes.Buffer
}

func (p rwPair) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p rwPair) Write(b []byte) (int, error) { return p.w.Write(b) }

func TestVersionAndMTU(t *testing.T) {
	// A peer announcing 6.29 (which would negotiate its binary struct with a
	// peer ≥ 6.28) and MTU 4096 against our 1024: we keep 1024.
	var in, out bytes.Buffer
	in.WriteString("6.29" + strings.Repeat("\x00", 12))
	in.Write([]byte{0, 0, 0x10, 0, 0, 0, 0, 128})
	in.WriteString("5\x00")
	c := NewConn(rwPair{&in, &out}, false)
	if v, err := c.ExchangeVersion(); err != nil || v != "6.29" {
		t.Fatalf("version %q %v", v, err)
	}
	page, line, err := c.ExchangeSysData(16384, 64)
	if err != nil || page != 16384 || line != 128 {
		t.Fatalf("sys data %d %d %v", page, line, err)
	}
	if m, err := c.ExchangeMTU(3); err != nil || m != 3 {
		t.Fatalf("MTU %d %v", m, err)
	}
	want := "6.06" + strings.Repeat("\x00", 12) + "\x00\x00\x40\x00" + "\x00\x00\x00\x40" + "3\x00"
	if out.String() != want {
		t.Fatalf("wrote %q, want %q", out.String(), want)
	}

	// An old peer is refused; an invalid MTU code from the peer is ignored.
	for _, old := range []string{"5.60", "", "abc", "4.5"} {
		in.Reset()
		in.WriteString(old + strings.Repeat("\x00", 16-len(old)))
		if _, err := NewConn(rwPair{&in, &out}, false).ExchangeVersion(); err == nil {
			t.Errorf("peer version %q accepted", old)
		}
	}
	for peer, want := range map[string]MTU{"9\x00": 4, "0\x00": 4, "x\x00": 4, "2\x00": 2, "12": 4} {
		in.Reset()
		in.WriteString(peer)
		if m, err := NewConn(rwPair{&in, &out}, true).ExchangeMTU(4); err != nil || m != want {
			t.Errorf("peer MTU %q: got %d %v, want %d", peer, m, err, want)
		}
	}
	if VersionNumber("6.06") != 6.06 || VersionNumber("5.70-beta") != 5.70 || VersionNumber("x") != 0 {
		t.Error("VersionNumber")
	}
	if MTUFromBytes(1500) != 3 || MTUFromBytes(4200) != 5 || MTUFromBytes(100) != 0 || MTU(5).Bytes() != 4096 {
		t.Error("MTU conversions")
	}
}

func TestFinishAcceptsCloseOrDone(t *testing.T) {
	var out bytes.Buffer
	for _, peer := range []string{"done\x00", "", "do"} {
		if err := NewConn(rwPair{bytes.NewBufferString(peer), &out}, true).Finish(); err != nil {
			t.Errorf("peer %q: %v", peer, err)
		}
	}
	if err := NewConn(rwPair{bytes.NewBufferString("nope!"), &out}, true).Finish(); err == nil {
		t.Error("garbage accepted as done")
	}
}

func TestReportsRoundTrip(t *testing.T) {
	var wire, back bytes.Buffer
	r := BWReport{Size: 65536, Iters: 5000, PeakBW: 1234.5, AvgBW: 1200.25, MsgRate: 0.019204}
	peer := bytes.NewBuffer(make([]byte, 40)) // the peer's five values: zeros
	if got, err := NewConn(rwPair{peer, &wire}, true).ExchangeReports(r); err != nil || got != (BWReport{}) {
		t.Fatalf("client: %+v %v", got, err)
	}
	if wire.Len() != 40 || wire.Bytes()[5] != 1 || wire.Bytes()[16] != 0x40 {
		t.Fatalf("wire % x", wire.Bytes())
	}
	got, err := NewConn(rwPair{&wire, &back}, false).ExchangeReports(BWReport{})
	if err != nil || got != r {
		t.Fatalf("server: %+v %v", got, err)
	}
}

// recordingLocal is a device stand-in for ours-against-ours runs.
type recordingLocal struct {
	mu    sync.Mutex
	dests []Dest
	log   []string
}

func (l *recordingLocal) Dests(n Negotiated) ([]Dest, error) { return l.dests, nil }
func (l *recordingLocal) Connect(r []Dest) error {
	l.add(fmt.Sprintf("connect %d", len(r)))
	return nil
}
func (l *recordingLocal) PostReceives(size uint64) error {
	l.add(fmt.Sprintf("recv %d", size))
	return nil
}
func (l *recordingLocal) Run(size uint64) (BWReport, error) {
	l.add(fmt.Sprintf("run %d", size))
	return BWReport{Size: size, Iters: 7, AvgBW: 1}, nil
}
func (l *recordingLocal) add(s string) { l.mu.Lock(); l.log = append(l.log, s); l.mu.Unlock() }

func dests(n int, addr string, qpn uint32) []Dest {
	d := make([]Dest, n)
	for i := range d {
		d[i] = Dest{QPN: qpn + uint32(i), PSN: 0x1000 + uint32(i), RKey: 0xabc, VAddr: 0x10000, GID: GIDFromAddr(netip.MustParseAddr(addr))}
	}
	return d
}

// TestOursAgainstOurs runs our server against our client over loopback TCP
// for every test program, transport, QP count and -a: the phases must line
// up (a mismatch deadlocks or desynchronises the fixed-size reads).
func TestOursAgainstOurs(t *testing.T) {
	for _, verb := range []Verb{Send, Write, Read, Atomic} {
		for _, m := range []Measure{BW, Latency} {
			for _, tr := range []Transport{RC, UC, UD} {
				if (tr == UD && verb != Send) || (tr == UC && (verb == Read || verb == Atomic)) {
					continue
				}
				for _, all := range []bool{false, true} {
					test := Test{Verb: verb, Measure: m, Transport: tr, QPs: 2, Size: 4096, AllSizes: all}
					t.Run(fmt.Sprintf("%s/%v/all=%v", test.Name(), tr, all), func(t *testing.T) {
						cc, sc := loopback(t)
						srv := &recordingLocal{dests: dests(2, "10.1.0.2", 0x20)}
						cli := &recordingLocal{dests: dests(2, "10.1.0.1", 0x11)}
						var sout Outcome
						var serr error
						done := make(chan struct{})
						go func() {
							defer close(done)
							sout, serr = Run(context.Background(), sc, Config{Test: test, MTU: 3, PageSize: 4096, CacheLine: 64}, srv)
							if serr != nil {
								sc.Close()
							}
						}()
						cout, cerr := Run(context.Background(), cc, Config{Test: test, Client: true, MTU: 5, PageSize: 4096, CacheLine: 64}, cli)
						if cerr != nil {
							cc.Close()
						}
						<-done
						if cerr != nil || serr != nil {
							t.Fatalf("client %v, server %v", cerr, serr)
						}
						if cout.MTU != 3 || sout.MTU != 3 || cout.Remote[1] != srv.dests[1] || sout.Remote[1] != cli.dests[1] {
							t.Fatalf("negotiated client %+v server %+v", cout, sout)
						}
						runs := 0
						for _, s := range cli.log {
							if strings.HasPrefix(s, "run") {
								runs++
							}
						}
						if want := len(cout.Sizes); runs != want {
							t.Errorf("client ran %d sizes, want %d (%v)", runs, want, cli.log)
						}
						if test.Measure == BW && test.Verb != Send {
							if sout.PeerReport == nil || sout.PeerReport.Iters != 7 {
								t.Errorf("server got report %+v", sout.PeerReport)
							}
						}
					})
				}
			}
		}
	}
}

func TestSizes(t *testing.T) {
	ud := Test{Verb: Send, Measure: BW, Transport: UD, Size: 65536}
	if s, err := ud.Sizes(3); err != nil || len(s) != 1 || s[0] != 1024 {
		t.Errorf("UD default clamps to the MTU: %v %v", s, err)
	}
	ud.SizeGiven = true
	if _, err := ud.Sizes(3); err == nil {
		t.Error("UD -s above the MTU accepted")
	}
	ud.AllSizes = true
	if s, _ := ud.Sizes(3); len(s) != 10 || s[9] != 1024 || s[0] != 2 {
		t.Errorf("UD -a sizes %v", s)
	}
	if s, _ := (Test{Verb: Write, AllSizes: true}).Sizes(3); len(s) != 23 || s[22] != 1<<23 {
		t.Errorf("-a sizes %v", s)
	}
	if s, _ := (Test{Verb: Atomic, Size: 4096, AllSizes: true}).Sizes(3); len(s) != 1 || s[0] != 8 {
		t.Errorf("atomic sizes %v", s)
	}
}

func TestRunCancelled(t *testing.T) {
	cc, _ := loopback(t) // the server never answers
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, cc, Config{Test: Test{Verb: Write, QPs: 1, Size: 2}, Client: true, MTU: 3, PageSize: 4096, CacheLine: 64},
		&recordingLocal{dests: dests(1, "10.1.0.1", 0x11)}); err == nil {
		t.Fatal("cancelled run succeeded")
	}
}
