package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/shmring"
)

// raw is an attacker's control connection: messages straight from
// daemon/proto.
type raw struct {
	conn *proto.Conn
	seq  uint32
	db   int // the daemon's doorbell (OPEN's reply)
}

func dial(path string) (*raw, error) {
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	r := &raw{conn: proto.NewConn(uc), db: -1}
	fds, err := r.call(proto.OpOpen, &proto.OpenReq{Version: proto.Version}, nil)
	if err != nil {
		uc.Close()
		return nil, err
	}
	if len(fds) == 1 {
		r.db = fds[0]
	}
	return r, nil
}

func (r *raw) call(op proto.Op, req, resp any, fds ...int) ([]int, error) {
	r.seq++
	if err := r.conn.Send(proto.Header{Op: op, Seq: r.seq}, req, fds...); err != nil {
		return nil, err
	}
	for {
		h, body, out, err := r.conn.Recv()
		if err != nil {
			return nil, err
		}
		if op == proto.OpOpen && h.Seq == 0 && h.Errno != 0 {
			return nil, unix.Errno(h.Errno) // refused at once
		}
		if h.Seq != r.seq {
			proto.CloseFDs(out)
			continue
		}
		if h.Errno != 0 {
			proto.CloseFDs(out)
			return nil, unix.Errno(h.Errno)
		}
		if resp != nil {
			if err := proto.DecodeBody(body, resp); err != nil {
				proto.CloseFDs(out)
				return nil, err
			}
		}
		return out, nil
	}
}

func (r *raw) close() {
	r.conn.Close()
	if r.db >= 0 {
		unix.Close(r.db)
	}
}

// tally counts outcomes by error.
type tally map[string]int

func (t tally) add(err error) {
	if err == nil {
		t["ok"]++
		return
	}
	var no unix.Errno
	if errors.As(err, &no) {
		t[errName(no)]++
		return
	}
	t[err.Error()]++
}

func (t tally) String() string {
	var ks []string
	for k := range t {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, t[k])
	}
	return b.String()
}

func errName(no unix.Errno) string {
	if n := unix.ErrnoName(no); n != "" {
		return n
	}
	return no.Error()
}

// memfd is a sealed memfd of n bytes, as the client library makes.
func memfd(n int) (int, error) {
	fd, err := unix.MemfdCreate("hostile", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, err
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// attacker runs one attacking role: it reports lines on stdout, then
// "holding", and keeps what it took until its stdin closes.
func attacker(role, path string, args []string) int {
	n := make([]int, len(args))
	for i, a := range args {
		n[i], _ = strconv.Atoi(a)
	}
	raiseNoFile()
	var held []*raw
	defer func() {
		for _, r := range held {
			r.close()
		}
	}()
	report := func(format string, a ...any) { fmt.Printf(format+"\n", a...) }
	switch role {
	case "silent":
		// Connections that never speak.
		t := tally{}
		deadline := time.Now().Add(time.Minute)
		for i := 0; i < n[0]; i++ {
			uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
			if errors.Is(err, unix.EAGAIN) && time.Now().Before(deadline) {
				// The listen queue is full: the daemon is slower to
				// accept than this loop is to connect. Wait for it.
				time.Sleep(time.Millisecond)
				i--
				continue
			}
			t.add(err)
			if err != nil {
				continue
			}
			defer uc.Close()
		}
		report("%d silent connections: %v", n[0], t)
	case "cqs":
		// conns connections × per CQs of depth each.
		conns, per, depth := n[0], n[1], n[2]
		open, cq := tally{}, tally{}
		for c := 0; c < conns; c++ {
			r, err := dial(path)
			open.add(err)
			if err != nil {
				continue
			}
			held = append(held, r)
			for i := 0; i < per; i++ {
				var resp proto.CreateCQResp
				_, err := r.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: uint32(depth)}, &resp)
				cq.add(err)
			}
		}
		report("%d connections: %v; %d CQs of depth %d each: %v", conns, open, per, depth, cq)
	case "maps":
		// conns connections × per one-page MRs, each in a memfd of its
		// own, and cqs CQs.
		conns, per, cqs := n[0], n[1], n[2]
		pg := unix.Getpagesize()
		open, mr, cq := tally{}, tally{}, tally{}
		for c := 0; c < conns; c++ {
			r, err := dial(path)
			open.add(err)
			if err != nil {
				continue
			}
			held = append(held, r)
			var pd proto.HandleMsg
			if _, err := r.call(proto.OpAllocPD, nil, &pd); err != nil {
				continue
			}
			for i := 0; i < per; i++ {
				fd, err := memfd(pg)
				if err != nil {
					mr.add(err)
					continue
				}
				_, err = r.call(proto.OpRegMR, &proto.RegMRReq{PD: pd.Handle, Access: ib.LocalWrite, Length: uint64(pg), IOVA: 0x10000}, nil, fd)
				unix.Close(fd)
				mr.add(err)
			}
			for i := 0; i < cqs; i++ {
				_, err := r.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 1}, nil)
				cq.add(err)
			}
		}
		report("%d connections: %v; %d one-page MRs in memfds of their own each: %v; %d CQs each: %v", conns, open, per, mr, cqs, cq)
	case "mrs":
		// n one-page MRs in one memfd: the registration rate. A
		// connection at its object limit is followed by another, so that
		// the device holds n MRs either way.
		pg := unix.Getpagesize()
		fd, err := memfd(n[0] * pg)
		if err != nil {
			report("memfd: %v", err)
			break
		}
		var r *raw
		var pd proto.HandleMsg
		next := func() error {
			var err error
			if r, err = dial(path); err != nil {
				return err
			}
			held = append(held, r)
			_, err = r.call(proto.OpAllocPD, nil, &pd)
			return err
		}
		if err := next(); err != nil {
			report("OPEN: %v", err)
			break
		}
		t := tally{}
		var first, last time.Duration
		start := time.Now()
		for i := 0; i < n[0]; i++ {
			if i == n[0]-1000 {
				start = time.Now()
			}
			req := proto.RegMRReq{PD: pd.Handle, Access: ib.LocalWrite | ib.RemoteWrite, Offset: uint64(i * pg), Length: uint64(pg), IOVA: uint64(i * pg)}
			_, err := r.call(proto.OpRegMR, &req, nil, fd)
			if (errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM)) && len(held) < 64 {
				if next() == nil {
					_, err = r.call(proto.OpRegMR, &proto.RegMRReq{PD: pd.Handle, Access: req.Access, Offset: req.Offset, Length: req.Length, IOVA: req.IOVA}, nil, fd)
				}
			}
			t.add(err)
			if i == 999 {
				first = time.Since(start)
			}
		}
		last = time.Since(start)
		report("%d one-page MRs in one memfd over %d connections: %v", n[0], len(held), t)
		report("registration: first 1000 in %v (%.0f/s), last 1000 (at %d) in %v (%.0f/s)", first.Round(time.Millisecond), 1000/first.Seconds(),
			n[0], last.Round(time.Millisecond), 1000/last.Seconds())
	case "qps":
		r, err := dial(path)
		if err != nil {
			report("OPEN: %v", err)
			break
		}
		held = append(held, r)
		var pd proto.HandleMsg
		var cq proto.CreateCQResp
		if _, err := r.call(proto.OpAllocPD, nil, &pd); err != nil {
			report("ALLOC_PD: %v", err)
			break
		}
		if _, err := r.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 64}, &cq); err != nil {
			report("CREATE_CQ: %v", err)
			break
		}
		t := tally{}
		for i := 0; i < n[0]; i++ {
			_, err := r.call(proto.OpCreateQP, &proto.CreateQPReq{PD: pd.Handle, SendCQ: cq.CQ, RecvCQ: cq.CQ, Type: ib.RC,
				Caps: ib.QPCaps{MaxSendWR: 16384, MaxRecvWR: 16384, MaxSendSGE: 32, MaxRecvSGE: 32}}, nil)
			t.add(err)
		}
		report("%d RC QPs of 16384/16384 WRs, 32/32 SGEs: %v", n[0], t)
	case "qkey":
		r, err := dial(path)
		if err != nil {
			report("OPEN as uid %d: %v", os.Getuid(), err)
			break
		}
		held = append(held, r)
		q, err := newQP(r, ib.UD, ib.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
		if err == nil {
			_, err = r.call(proto.OpModifyQP, &proto.ModifyQPReq{QP: q.h, Mask: ib.AttrState | ib.AttrPKeyIndex | ib.AttrPort | ib.AttrQKey,
				Attr: ib.QPAttr{State: ib.Init, Port: 1, QKey: 0x80010000}}, nil)
		}
		t := tally{}
		t.add(err)
		report("uid %d sets Q_Key 0x80010000 on its UD QP: %v", os.Getuid(), t)
	case "badwr":
		badWRs(path, report)
	default:
		report("unknown role %s", role)
		return 2
	}
	fmt.Println("holding")
	_, _ = io.Copy(io.Discard, os.Stdin) // until the bench closes it: then everything held goes
	return 0
}

func raiseNoFile() {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &rl) // if not, the attacker runs out of fds first, and says so
	}
}

// qp is an attacker's QP with its rings mapped.
type qp struct {
	h     proto.Handle
	qpn   uint32
	caps  ib.QPCaps
	sq    *shmring.Producer
	cq    *shmring.Consumer
	lkey  uint32
	iova  uint64
	ah    proto.Handle
	rings []*shmring.Ring
}

// newQP makes a PD, a 64 KiB MR, a CQ and a QP of typ with caps, and maps
// the SQ and CQ rings.
func newQP(r *raw, typ ib.QPType, caps ib.QPCaps) (*qp, error) {
	var pd proto.HandleMsg
	if _, err := r.call(proto.OpAllocPD, nil, &pd); err != nil {
		return nil, err
	}
	fd, err := memfd(1 << 16)
	if err != nil {
		return nil, err
	}
	var mr proto.RegMRResp
	_, err = r.call(proto.OpRegMR, &proto.RegMRReq{PD: pd.Handle, Access: ib.LocalWrite, Length: 1 << 16, IOVA: 0x100000}, &mr, fd)
	unix.Close(fd)
	if err != nil {
		return nil, err
	}
	var cq proto.CreateCQResp
	cfds, err := r.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 64}, &cq)
	if err != nil {
		return nil, err
	}
	var resp proto.CreateQPResp
	qfds, err := r.call(proto.OpCreateQP, &proto.CreateQPReq{PD: pd.Handle, SendCQ: cq.CQ, RecvCQ: cq.CQ, Type: typ, Caps: caps}, &resp)
	if err != nil {
		return nil, err
	}
	q := &qp{h: resp.QP, qpn: resp.QPN, caps: resp.Caps, lkey: mr.LKey, iova: 0x100000}
	if typ == ib.UD {
		// An address handle to the peer's namespace: UD WRs name one.
		peer, err := netip.ParseAddr(os.Getenv("SOFTRNIC_PEER"))
		if err != nil {
			return nil, fmt.Errorf("SOFTRNIC_PEER: %w", err)
		}
		var ah proto.HandleMsg
		if _, err := r.call(proto.OpCreateAH, &proto.CreateAHReq{PD: pd.Handle, AV: ib.AddressVector{DGID: ib.GIDFrom(peer)}}, &ah); err != nil {
			return nil, fmt.Errorf("CREATE_AH: %w", err)
		}
		q.ah = ah.Handle
	}
	cring, err := shmring.Map(cfds[0], shmring.Geometry{SlotSize: proto.CQESize, Slots: int(cq.Slots)})
	if err != nil {
		return nil, err
	}
	sring, err := shmring.Map(qfds[0], shmring.Geometry{SlotSize: proto.SendSlotSize(resp.Caps), Slots: int(resp.SQSlots)})
	if err != nil {
		return nil, err
	}
	unix.Close(qfds[1])
	q.rings = []*shmring.Ring{cring, sring}
	q.cq = cring.Consumer()
	q.sq = sring.Producer(shmring.DoorbellFD(r.db))
	return q, nil
}

// badWRs posts, each on a fresh QP in RTS after one good WR, a WR that
// fails a local check, and reports its completion and the QP's state.
func badWRs(path string, report func(string, ...any)) {
	le := binary.LittleEndian
	cases := []struct {
		name string
		typ  ib.QPType
		caps ib.QPCaps
		fill func(s []byte, q *qp)
	}{
		{"READ on UD", ib.UD, ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}, func(s []byte, q *qp) {
			s[8], s[10] = byte(ib.RDMARead), 1
			putSGE(s[64:], q)
		}},
		{"more SGEs than the QP's max", ib.UD, ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 256}, func(s []byte, q *qp) {
			s[8], s[10] = byte(ib.Send), 4
			for i := 0; i < 4; i++ {
				putSGE(s[64+16*i:], q)
			}
		}},
		{"inline over the QP's max", ib.UD, ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 32, MaxRecvSGE: 1}, func(s []byte, q *qp) {
			s[8], s[9] = byte(ib.Send), byte(ib.Inline|ib.Signaled)
			le.PutUint32(s[28:], uint32(q.caps.MaxInline)+50)
		}},
		{"unknown opcode", ib.UD, ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}, func(s []byte, q *qp) {
			s[8], s[10] = 200, 1
			putSGE(s[64:], q)
		}},
		{"unknown flag bits", ib.UD, ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}, func(s []byte, q *qp) {
			s[8], s[9], s[10] = byte(ib.Send), 0x80|byte(ib.Signaled), 1
			putSGE(s[64:], q)
		}},
	}
	for _, c := range cases {
		r, err := dial(path)
		if err != nil {
			report("%s: OPEN: %v", c.name, err)
			continue
		}
		q, err := newQP(r, c.typ, c.caps)
		if err == nil {
			for _, step := range []struct {
				st   ib.QPState
				mask ib.QPAttrMask
			}{{ib.Init, ib.AttrPKeyIndex | ib.AttrPort | ib.AttrQKey}, {ib.RTR, 0}, {ib.RTS, ib.AttrSQPSN}} {
				if _, err = r.call(proto.OpModifyQP, &proto.ModifyQPReq{QP: q.h, Mask: ib.AttrState | step.mask, Attr: ib.QPAttr{State: step.st, Port: 1, QKey: 0x11}}, nil); err != nil {
					break
				}
			}
		}
		if err != nil {
			report("%s: setting up: %v", c.name, err)
			r.close()
			continue
		}
		// A good WR (a datagram to a QP nobody has in the peer's
		// namespace) then the bad one, then another good one.
		ud := func(s []byte, id uint64) {
			clear(s)
			le.PutUint64(s, id)
			s[9] = byte(ib.Signaled)
			le.PutUint32(s[32:], 0x12345)
			le.PutUint32(s[36:], 0x11)
			le.PutUint32(s[40:], uint32(q.ah))
		}
		s := q.sq.Reserve()
		ud(s, 1)
		s[8], s[10] = byte(ib.Send), 1
		putSGE(s[64:], q)
		s = q.sq.Reserve()
		ud(s, 2)
		c.fill(s, q)
		s = q.sq.Reserve()
		ud(s, 3)
		s[8], s[10] = byte(ib.Send), 1
		putSGE(s[64:], q)
		if _, err := q.sq.Commit(); err != nil {
			report("%s: ringing the doorbell: %v", c.name, err)
		}
		var wcs []string
		for deadline := time.Now().Add(3 * time.Second); len(wcs) < 3 && time.Now().Before(deadline); {
			if slot := q.cq.Peek(); slot != nil {
				var wc ib.WC
				proto.GetWC(slot, &wc)
				q.cq.Release()
				wcs = append(wcs, fmt.Sprintf("#%d %v", wc.ID, wc.Status))
				continue
			}
			time.Sleep(time.Millisecond)
		}
		var attr ib.QPAttr
		_, err = r.call(proto.OpQueryQP, &proto.HandleMsg{Handle: q.h}, &attr)
		state := "?"
		if err == nil {
			state = attr.State.String()
		}
		report("%s: completions [%s]; QP then %s", c.name, strings.Join(wcs, ", "), state)
		r.close()
	}
}

func putSGE(s []byte, q *qp) {
	binary.LittleEndian.PutUint64(s, q.iova)
	binary.LittleEndian.PutUint32(s[8:], 8)
	binary.LittleEndian.PutUint32(s[12:], q.lkey)
}
