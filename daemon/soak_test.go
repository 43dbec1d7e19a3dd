package daemon_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/shmring"
	"github.com/softrnic/softrnic/internal/testlink"
	"github.com/softrnic/softrnic/verbs"
)

// The soak: 16 well-behaved clients stream RDMA WRITEs through the daemon
// to a peer device while one hostile client, a process of its own, works
// through every attack again and again (silent connections, connections,
// CQs and MRs up to its limits, QPs up to its queue memory, malformed and
// refused WRs, a scribbled ring, a controlled Q_Key). Their throughput
// while it attacks must stay above half of theirs while it does not,
// measured over equal windows taken in turn, and none of their WRs may
// fail or QPs leave RTS.
func TestSoakHostileClient(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: about 30 s")
	}
	devA, devB := testlink.Pair(t, 1024)
	lim := daemon.DefaultLimits(daemon.ReadHost())
	lim[daemon.Connections][daemon.PerUID] = 64 // the stream's 16 and the attacker's, same uid
	lim[daemon.FDs][daemon.PerConn] = 256
	lim[daemon.Mappings][daemon.PerConn] = 256
	lim[daemon.QueueBytes][daemon.PerConn] = 96 << 20
	srv, path, served := serveIn(t, t.TempDir(), devA, daemon.Options{Limits: lim, OpenTimeout: 300 * time.Millisecond})

	const clients = 16
	type stream struct {
		ok     atomic.Uint64
		failed atomic.Pointer[string]
		qp     verbs.QP
	}
	streams := make([]*stream, clients)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range streams {
		c, err := client.Dial(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		caps := ib.QPCaps{MaxSendWR: 16, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}
		a := newApp(t, c, ib.RC, 1<<16, ib.LocalWrite, 64, caps)
		b := newApp(t, devB, ib.RC, 1<<16, ib.LocalWrite|ib.RemoteWrite, 16, caps)
		connectRC(t, a.qp, 0, b.qp.QPN(), gidB, 0, 0)
		connectRC(t, b.qp, ib.RemoteWrite, a.qp.QPN(), gidA, 0, 0)
		s := &stream{qp: a.qp}
		streams[i] = s
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := []verbs.SendWR{{Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{a.sge(0, 4096)}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}}
			wcs := make([]ib.WC, 16)
			out := 0
			for {
				select {
				case <-stop:
					return
				default:
				}
				for out < 8 {
					if n, _ := a.qp.PostSend(w); n != 1 {
						break
					}
					out++
				}
				n := a.cq.Poll(wcs)
				for _, wc := range wcs[:n] {
					out--
					if wc.Status != ib.Success {
						msg := fmt.Sprintf("%v", wc.Status)
						s.failed.CompareAndSwap(nil, &msg)
						return
					}
					s.ok.Add(1)
				}
				if n == 0 {
					_ = a.cq.Wait(time.Millisecond) // a timeout or a wakeup: poll again
				}
			}
		}()
	}
	total := func() uint64 {
		var n uint64
		for _, s := range streams {
			n += s.ok.Load()
		}
		return n
	}
	// Warm up, then windows in turn: quiet, attacked, quiet, attacked.
	time.Sleep(time.Second)
	const window = 3 * time.Second
	measure := func() uint64 {
		n0 := total()
		time.Sleep(window)
		return total() - n0
	}
	var quiet, attacked uint64
	var report []string
	for round := 0; round < 2; round++ {
		quiet += measure()
		cmd, out, in := startChild(t, "soak", path)
		// It attacks until told to stop; the window starts with its
		// first round under way.
		if l, err := out.ReadString('\n'); err != nil || l != "attacking\n" {
			t.Fatalf("attacker: %q %v", l, err)
		}
		attacked += measure()
		if _, err := io.WriteString(in, "stop\n"); err != nil {
			t.Fatal(err)
		}
		rest, _ := io.ReadAll(out)
		cmd.Wait()
		report = append(report, strings.TrimSpace(string(rest)))
	}
	close(stop)
	wg.Wait()
	for i, s := range streams {
		if f := s.failed.Load(); f != nil {
			t.Errorf("stream %d: a WRITE completed with %s", i, *f)
		}
		if st := s.qp.(interface{ State() ib.QPState }).State(); st != ib.RTS {
			t.Errorf("stream %d: QP in %v", i, st)
		}
	}
	mib := func(n uint64) float64 { return float64(n) * 4096 / window.Seconds() / 2 / (1 << 20) }
	t.Logf("16 streams of 4 KiB WRITEs: %.1f MiB/s quiet, %.1f MiB/s under attack (%d and %d WRITEs over 2 × %v each)",
		mib(quiet), mib(attacked), quiet, attacked, window)
	for i, r := range report {
		t.Logf("attacker, round %d: %s", i+1, r)
	}
	u := srv.Usage()
	t.Logf("daemon: refusals by limit %v; bad WQEs %d; shed %d; accept errors %d", u.Refusals, srv.BadWQEs.Load(), srv.ShedConns.Load(), srv.AcceptErrors.Load())
	if attacked < quiet/2 {
		t.Errorf("throughput under attack %d WRITEs, less than half of %d", attacked, quiet)
	}
	if srv.BadWQEs.Load() == 0 || u.Refusals[daemon.QueueBytes][daemon.PerConn] == 0 || u.Refusals[daemon.FDs][daemon.PerConn] == 0 ||
		u.Refusals[daemon.Mappings][daemon.PerConn] == 0 || srv.ShedConns.Load() == 0 {
		t.Errorf("the attacks did not all reach the daemon's limits")
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned: %v", err)
	default:
	}
}

// soakAttacker works through every attack, again and again, until a line
// on stdin, then reports what it got and exits (everything it held goes
// with it).
func soakAttacker(path string) int {
	stopped := make(chan struct{})
	go func() {
		var b [1]byte
		_, _ = os.Stdin.Read(b[:]) // a line, or the test's end
		close(stopped)
	}()
	tb := &childTB{}
	got := map[string]int{}
	note := func(what string, err error) {
		var no unix.Errno
		switch {
		case err == nil:
			got[what+" ok"]++
		case errors.As(err, &no):
			got[what+" "+unix.ErrnoName(no)]++
		default:
			got[what+" "+err.Error()]++
		}
	}
	pg := unix.Getpagesize()
	first := true
	for rounds := 0; ; rounds++ {
		select {
		case <-stopped:
			fmt.Printf("%d rounds: %v\n", rounds, got)
			return 0
		default:
		}
		// Silent connections, dropped by the daemon after OpenTimeout.
		var silent []*net.UnixConn
		for i := 0; i < 32; i++ {
			if uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"}); err == nil {
				silent = append(silent, uc)
			}
		}
		if first {
			fmt.Println("attacking")
			first = false
		}
		// Connections up to the uid's limit.
		var conns []*rawClient
		for i := 0; i < 80; i++ {
			r, err := dialRaw(tb, path)
			if err == nil {
				err = r.call(proto.OpOpen, &proto.OpenReq{Version: proto.Version}, nil)
			}
			if err != nil {
				note("connection", err)
				if r != nil {
					r.conn.Close()
				}
				break
			}
			conns = append(conns, r)
		}
		for _, r := range conns[min(len(conns), 2):] {
			r.conn.Close()
		}
		if len(conns) < 2 {
			continue
		}
		a, b := conns[0], conns[1]
		// CQs up to the connection's fds.
		for i := 0; i < 500; i++ {
			if err := a.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 1}, nil); err != nil {
				note("CQ", err)
				break
			}
		}
		// MRs in memfds of their own, up to the connection's mappings.
		pd := b.allocPD()
		for i := 0; i < 500; i++ {
			fd, err := unix.MemfdCreate("soak", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
			if err != nil {
				break
			}
			if err = unix.Ftruncate(fd, int64(pg)); err == nil {
				_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
			}
			if err == nil {
				err = b.call(proto.OpRegMR, &proto.RegMRReq{PD: pd, Access: ib.LocalWrite, Length: uint64(pg), IOVA: 0x1000}, nil, fd)
			}
			unix.Close(fd)
			if err != nil {
				note("MR", err)
				break
			}
		}
		a.conn.Close()
		b.conn.Close()
		// QPs of the largest queues, up to the queue memory.
		c, err := dialRaw(tb, path)
		if err == nil {
			err = c.call(proto.OpOpen, &proto.OpenReq{Version: proto.Version}, nil)
		}
		if err == nil {
			pd := c.allocPD()
			var cq proto.CreateCQResp
			if err := c.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 16}, &cq); err != nil {
				note("CQ", err)
			}
			for i := 0; i < 50; i++ {
				req := proto.CreateQPReq{PD: pd, SendCQ: cq.CQ, RecvCQ: cq.CQ, Type: ib.RC, Caps: ib.QPCaps{MaxSendWR: 16384, MaxRecvWR: 16384, MaxSendSGE: 32, MaxRecvSGE: 32}}
				if err := c.call(proto.OpCreateQP, &req, nil); err != nil {
					note("QP", err)
					break
				}
			}
			c.conn.Close()
		}
		// Malformed and refused WRs, a scribbled ring index, a
		// controlled Q_Key.
		if d, err := dialRaw(tb, path); err == nil {
			if d.call(proto.OpOpen, &proto.OpenReq{Version: proto.Version}, nil) == nil {
				note("bad WRs", badRing(d))
				note("controlled Q_Key", setQKey(d, 0x80010000))
			}
			d.conn.Close()
		}
		for _, uc := range silent {
			uc.Close()
		}
	}
}

// badRing makes an RC QP on d and fills its SQ ring with WRs that fail
// the daemon's or the device's checks, then scribbles over the ring's
// producer index.
func badRing(d *rawClient) error {
	pd := d.allocPD()
	var cq proto.CreateCQResp
	cfds, err := d.callFDs(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 16}, &cq)
	if err != nil {
		return err
	}
	proto.CloseFDs(cfds)
	var qp proto.CreateQPResp
	caps := ib.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}
	qfds, err := d.callFDs(proto.OpCreateQP, &proto.CreateQPReq{PD: pd, SendCQ: cq.CQ, RecvCQ: cq.CQ, Type: ib.UC, Caps: caps}, &qp)
	if err != nil {
		return err
	}
	unix.Close(qfds[1])
	scribble, err := unix.Dup(qfds[0])
	if err != nil {
		unix.Close(qfds[0])
		return err
	}
	defer unix.Close(scribble)
	ring, err := shmring.Map(qfds[0], shmring.Geometry{SlotSize: proto.SendSlotSize(qp.Caps), Slots: int(qp.SQSlots)})
	if err != nil {
		return err
	}
	defer ring.Close()
	for _, st := range []ib.QPState{ib.Init, ib.RTR, ib.RTS} {
		attr := ib.QPAttr{State: st, PathMTU: 1024, DestQPN: 0x999, AV: ib.AddressVector{DGID: gidB}}
		mask := ib.AttrState
		switch st {
		case ib.Init:
			mask |= ib.AttrPKeyIndex | ib.AttrPort | ib.AttrAccessFlags
			attr.Port = 1
		case ib.RTR:
			mask |= ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrRQPSN
		case ib.RTS:
			mask |= ib.AttrSQPSN
		}
		if err := d.call(proto.OpModifyQP, &proto.ModifyQPReq{QP: qp.QP, Mask: mask, Attr: attr}, nil); err != nil {
			return err
		}
	}
	p := ring.Producer(nil)
	le := binary.LittleEndian
	for i, fill := range []func(s []byte){
		func(s []byte) { s[8], s[10] = byte(ib.RDMARead), 1 },                           // READ on UC
		func(s []byte) { s[8], s[10] = byte(ib.Send), 9 },                               // SGEs beyond the QP's max, and the slot's
		func(s []byte) { s[8], s[10] = 77, 1 },                                          // unknown opcode
		func(s []byte) { s[8], s[9] = byte(ib.Send), 0x40 },                             // unknown flag
		func(s []byte) { s[8], s[9] = byte(ib.Send), 1<<3; le.PutUint32(s[28:], 9999) }, // inline beyond the slot
	} {
		s := p.Reserve()
		if s == nil {
			break
		}
		clear(s)
		le.PutUint64(s, uint64(i+1))
		fill(s)
	}
	if _, err := p.Commit(); err != nil {
		return err
	}
	// Then the ring's producer index far ahead of its slots (the
	// header's second cache line).
	time.Sleep(time.Millisecond)
	hdr, err := unix.Mmap(scribble, 0, shmring.HeaderSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	le.PutUint64(hdr[64:], le.Uint64(hdr[64:])+1<<30)
	return unix.Munmap(hdr)
}
