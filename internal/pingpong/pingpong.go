package pingpong

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/verbs"
)

// Work request IDs, as the stock tools use them: a bit each, so that
// "pending" is a mask of what the current iteration still waits for.
const (
	recvWRID = 1
	sendWRID = 2
)

// udQKey is the Q_Key both stock tools' UD QPs use.
const udQKey = 0x11111111

// grhLen is the GRH slot at the start of a UD receive buffer: the stock
// UD tool's buffer is size+40 bytes, receives land at 0 and sends go from
// 40.
const grhLen = 40

// pageSize is the stride of --chk's marks: the stock tools use the host's
// page size, 4096 on the machines they interoperate with here.
const pageSize = 4096

// fillByte is what the stock tools memset their buffer to.
const fillByte = 0x7b

// Host is what a run needs from the machine: the RNIC (a device of this
// process driven by an engine loop elsewhere, which resolves peers' MACs
// itself, or a softrnic daemon's) and the interface it is on.
type Host struct {
	Device verbs.Device
	Iface  host.Interface
}

// Result is what a run measured and checked.
type Result struct {
	Local, Remote Dest
	Bytes         int64 // size × iters × 2, as the tools count
	Iters         int
	Elapsed       time.Duration
	Checked       int   // received messages whose every byte --chk checked
	BadPages      []int // pages of the message --chk rejected, if any
}

// Run runs one ping-pong over the side channel conn (the client when
// p.Host is set), printing the stock tools' lines to out. It always
// destroys what it created.
func Run(ctx context.Context, h Host, p Params, conn io.ReadWriter, out io.Writer) (_ Result, err error) {
	s := &session{h: h, p: p, out: out, ctx: ctx, client: p.Host != ""}
	defer func() { err = errors.Join(err, s.close()) }()
	return s.run(conn)
}

type session struct {
	h      Host
	p      Params
	out    io.Writer
	ctx    context.Context
	client bool

	gid    netip.Addr
	gidIdx int
	pd     verbs.PD
	mem    verbs.Mem
	mr     verbs.MR
	buf    []byte // the MR: RC size bytes; UD GRH slot + size
	cq     verbs.CQ
	qp     verbs.QP
	ah     verbs.AH
	local  Dest
	remote Dest
	res    Result

	swr  [1]verbs.SendWR
	ssge [1]ib.SGE
	rwr  [1]verbs.RecvWR
	rsge [1]ib.SGE
	wcs  [2]ib.WC
}

func (s *session) ud() bool { return s.p.Transport == UD }

func (s *session) run(conn io.ReadWriter) (Result, error) {
	if s.h.Device == nil {
		return s.res, errors.New("pingpong: no device")
	}
	if err := s.setup(); err != nil {
		return s.res, err
	}
	// Receives first: a server's peer sends as soon as it has our record.
	if err := s.postRecvs(s.p.RxDepth); err != nil {
		return s.res, err
	}
	s.printDest("local", s.local, s.ud())
	var err error
	if s.client {
		s.remote, err = ClientExchange(conn, s.local)
	} else {
		s.remote, err = ServerExchange(conn, s.local, s.connect)
	}
	if err != nil {
		return s.res, err
	}
	s.res.Remote = s.remote
	s.printDest("remote", s.remote, false)
	if s.client {
		if err := s.connect(s.remote); err != nil {
			return s.res, err
		}
	}
	if err := s.loop(); err != nil {
		return s.res, err
	}
	return s.res, nil
}

func (s *session) printDest(which string, d Dest, udLocal bool) {
	if s.out == nil {
		return
	}
	sep := ","
	if udLocal {
		sep = ":" // ibv_ud_pingpong's local line has a colon there
	}
	pad := " "
	if which == "local" {
		pad = "  "
	}
	fmt.Fprintf(s.out, "  %s address:%sLID 0x%04x, QPN 0x%06x, PSN 0x%06x%s GID %s\n", which, pad, d.LID, d.QPN, d.PSN, sep, d.GIDString())
}

// setup creates the PD, the MR over the buffer, the CQ and the QP (in
// INIT), with the stock tools' sizes: a send queue of one, rx-depth
// receives, a CQ of rx-depth + 1.
func (s *session) setup() error {
	gid, err := s.h.Iface.GID(s.p.GIDIndex)
	if err != nil {
		return err
	}
	s.gid, s.gidIdx = gid, s.p.GIDIndex
	if s.gidIdx < 0 {
		for i, g := range s.h.Iface.GIDs {
			if g == gid {
				s.gidIdx = i
				break
			}
		}
	}
	portMTU := int(s.h.Device.Query().ActiveMTU)
	if s.ud() && s.p.Size > portMTU {
		return fmt.Errorf("pingpong: requested size larger than port MTU (%d)", portMTU)
	}
	if !s.ud() && s.p.MTU > portMTU {
		return fmt.Errorf("pingpong: path MTU %d is larger than %s's active MTU %d", s.p.MTU, s.h.Iface.Name, portMTU)
	}
	n := s.p.Size
	if s.ud() {
		n += grhLen
	}
	dev := s.h.Device
	if s.mem, err = dev.AllocMem(n); err != nil {
		return err
	}
	s.buf = s.mem.Bytes()[:n]
	for i := range s.buf {
		s.buf[i] = fillByte
	}
	if s.pd, err = dev.AllocPD(); err != nil {
		return err
	}
	if s.mr, err = s.pd.RegMR(s.mem, 0, n, 0, ib.LocalWrite); err != nil {
		return err
	}
	if s.cq, err = dev.CreateCQ(s.p.RxDepth + 1); err != nil {
		return err
	}
	typ := ib.RC
	if s.ud() {
		typ = ib.UD
	}
	if s.qp, err = s.pd.CreateQP(&verbs.QPInitAttr{Type: typ, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: ib.QPCaps{MaxSendWR: 1, MaxRecvWR: uint32(s.p.RxDepth), MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return err
	}
	init, mask := ib.QPAttr{State: ib.Init, Port: 1}, ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags
	if s.ud() {
		init.QKey, mask = udQKey, ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey
	}
	if err := s.qp.Modify(&init, mask); err != nil {
		return err
	}
	var r [4]byte
	rand.Read(r[:])
	s.local = Dest{QPN: s.qp.QPN(), PSN: binary.LittleEndian.Uint32(r[:]) & bth.PSNMask, GID: GIDFromAddr(gid)}
	s.res.Local = s.local
	return nil
}

// connect moves the QP to RTR and RTS toward the peer with the stock
// tools' attributes (RC: RTR with the path MTU, the peer's QPN and PSN,
// one READ/atomic, min RNR timer 12; RTS with timeout 14, retry 7, RNR
// retry 7), or for UD makes the address handle of the peer's GID.
func (s *session) connect(d Dest) error {
	peer := d.Addr()
	if !peer.IsValid() {
		return errors.New("pingpong: the peer sent no GID (run it with -g GID_INDEX: RoCE needs one)")
	}
	if peer.Is4() != s.gid.Is4() {
		return fmt.Errorf("pingpong: peer GID %v and ours %v differ in IP version", peer, s.gid)
	}
	// The RNIC resolves the peer's MAC (RTR, the address handle).
	av := ib.AddressVector{DGID: ib.GIDFrom(peer), SGIDIndex: uint8(s.gidIdx)}
	var err error
	if s.ud() {
		if err := s.qp.Modify(&ib.QPAttr{State: ib.RTR}, ib.AttrState); err != nil {
			return fmt.Errorf("pingpong: QP %#x to RTR: %w", s.local.QPN, err)
		}
		if err := s.qp.Modify(&ib.QPAttr{State: ib.RTS, SQPSN: s.local.PSN}, ib.AttrState|ib.AttrSQPSN); err != nil {
			return fmt.Errorf("pingpong: QP %#x to RTS: %w", s.local.QPN, err)
		}
		av.UDPSrcPort = rnic.UDSourcePort(s.local.QPN) // per QP, as rxe's UD frames
		if s.ah, err = s.pd.CreateAH(&av); err != nil {
			return fmt.Errorf("pingpong: address handle to %v: %w", peer, err)
		}
		return nil
	}
	rtr := ib.QPAttr{State: ib.RTR, PathMTU: uint32(s.p.MTU), DestQPN: d.QPN, RQPSN: d.PSN, MaxDestRdAtomic: 1, MinRNRTimer: 12, AV: av}
	if err := s.qp.Modify(&rtr, ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|
		ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer); err != nil {
		return fmt.Errorf("pingpong: QP %#x to RTR: %w", s.local.QPN, err)
	}
	rts := ib.QPAttr{State: ib.RTS, SQPSN: s.local.PSN, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}
	if err := s.qp.Modify(&rts, ib.AttrState|ib.AttrSQPSN|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|
		ib.AttrMaxQPRdAtomic); err != nil {
		return fmt.Errorf("pingpong: QP %#x to RTS: %w", s.local.QPN, err)
	}
	return nil
}

// postRecvs posts n receives, all into the one buffer (UD: with its GRH
// slot), as the stock tools do: only one message is in flight at a time.
func (s *session) postRecvs(n int) error {
	s.rsge[0] = ib.SGE{Addr: s.mr.IOVA(), Length: uint32(len(s.buf)), LKey: s.mr.LKey()}
	s.rwr[0] = verbs.RecvWR{ID: recvWRID, SG: s.rsge[:]}
	for range n {
		if _, err := s.qp.PostRecv(s.rwr[:]); err != nil {
			return fmt.Errorf("pingpong: post receive: %w", err)
		}
	}
	return nil
}

// postSend sends the message: the buffer (UD: after the GRH slot), which
// holds what was last received, so that the server echoes the client.
func (s *session) postSend() error {
	off := uint64(0)
	if s.ud() {
		off = grhLen
	}
	s.ssge[0] = ib.SGE{Addr: s.mr.IOVA() + off, Length: uint32(s.p.Size), LKey: s.mr.LKey()}
	s.swr[0] = verbs.SendWR{ID: sendWRID, Opcode: ib.Send, Flags: ib.Signaled, SG: s.ssge[:]}
	if s.ud() {
		s.swr[0].AH, s.swr[0].RemoteQPN, s.swr[0].RemoteQKey = s.ah, s.remote.QPN, udQKey
	}
	if _, err := s.qp.PostSend(s.swr[:]); err != nil {
		return fmt.Errorf("pingpong: post send: %w", err)
	}
	return nil
}

// data is the message part of the buffer.
func (s *session) data() []byte {
	if s.ud() {
		return s.buf[grhLen:]
	}
	return s.buf
}

// markPages writes --chk's marks: the first byte of every page of the
// message is i/page % sizeof(char) in the stock tools, which is 0; the
// rest keeps the buffer's 0x7b.
func markPages(b []byte) {
	for i := 0; i < len(b); i += pageSize {
		b[i] = 0
	}
}

// PatternByte is the byte at offset i of every message of a --chk run,
// in both directions: the client marks its buffer once, and the server
// echoes what it receives.
func PatternByte(i int) byte {
	if i%pageSize == 0 {
		return 0
	}
	return fillByte
}

// badPages returns the pages of b that differ from the --chk pattern.
func badPages(b []byte, into []int) []int {
	for pg := 0; pg*pageSize < len(b); pg++ {
		p := b[pg*pageSize : min(len(b), (pg+1)*pageSize)]
		ok := p[0] == 0
		for _, c := range p[1:] {
			if c != fillByte {
				ok = false
				break
			}
		}
		if !ok {
			into = append(into, pg)
		}
	}
	return into
}

// stallLimit is how long the loop waits for a completion before it gives
// up on the peer: longer than an RC QP takes to exhaust its retries at
// timeout 14 (then the QP reports an error completion anyway). A UD
// message lost on the way would otherwise hang the run for ever, as it
// does the stock tool.
func stallLimit() time.Duration {
	return max(10*time.Second, 2*8*rc.AckTimeout(14))
}

// loop is the stock tools' iteration: the client sends first; each side
// sends its next message when both its previous SEND and the peer's
// message have completed; receives are reposted when one is left.
func (s *session) loop() error {
	routs := s.p.RxDepth
	pending := recvWRID
	if s.client {
		if s.p.Check {
			markPages(s.data())
		}
		if err := s.postSend(); err != nil {
			return err
		}
		pending |= sendWRID
	}
	start := time.Now()
	var rcnt, scnt int
	timer := time.NewTimer(stallLimit())
	defer timer.Stop()
	notify, _ := s.cq.(verbs.Notifier)
	var lastWC time.Time
	for rcnt < s.p.Iters || scnt < s.p.Iters {
		n := s.cq.Poll(s.wcs[:])
		if n == 0 {
			if notify == nil {
				// A CQ that cannot notify (the daemon's): sleep on it
				// in steps, checking the context and the stall limit.
				if lastWC.IsZero() {
					lastWC = time.Now()
				}
				if err := s.ctx.Err(); err != nil {
					return err
				}
				if time.Since(lastWC) > stallLimit() {
					return fmt.Errorf("pingpong: no completion for %v after %d sends and %d receives: the peer stopped answering", stallLimit(), scnt, rcnt)
				}
				if err := s.cq.Wait(cqWaitStep); err != nil {
					return err
				}
				continue
			}
			timer.Reset(stallLimit())
			select {
			case <-notify.Notify():
				continue
			case <-s.ctx.Done():
				return s.ctx.Err()
			case <-timer.C:
				return fmt.Errorf("pingpong: no completion for %v after %d sends and %d receives: the peer stopped answering", stallLimit(), scnt, rcnt)
			}
		}
		lastWC = time.Time{}
		for _, wc := range s.wcs[:n] {
			if wc.Status != ib.Success {
				return fmt.Errorf("pingpong: failed status %v for wr_id %d", wc.Status, wc.ID)
			}
			switch wc.ID {
			case sendWRID:
				scnt++
			case recvWRID:
				if routs--; routs <= 1 {
					if err := s.postRecvs(s.p.RxDepth - routs); err != nil {
						return err
					}
					routs = s.p.RxDepth
				}
				rcnt++
				if err := s.received(&wc); err != nil {
					return err
				}
			default:
				return fmt.Errorf("pingpong: completion for unknown wr_id %d", wc.ID)
			}
			pending &^= int(wc.ID)
			if scnt < s.p.Iters && pending == 0 {
				if err := s.postSend(); err != nil {
					return err
				}
				pending = recvWRID | sendWRID
			}
		}
	}
	el := time.Since(start)
	s.res.Iters, s.res.Elapsed = s.p.Iters, el
	s.res.Bytes = int64(s.p.Size) * int64(s.p.Iters) * 2
	if s.out != nil {
		usec := float64(el.Nanoseconds()) / 1e3
		fmt.Fprintf(s.out, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", s.res.Bytes, usec/1e6, float64(s.res.Bytes)*8/usec)
		fmt.Fprintf(s.out, "%d iters in %.2f seconds = %.2f usec/iter\n", s.p.Iters, usec/1e6, usec/float64(s.p.Iters))
	}
	return nil
}

// received checks one received message: its length, and with --chk every
// byte against the pattern (the stock client checks only the first byte
// of each page, once, at the end; checking every message whole catches
// what that cannot). A UD message must come from the peer's QP, behind a
// GRH slot.
func (s *session) received(wc *ib.WC) error {
	want := uint32(s.p.Size)
	if s.ud() {
		want += grhLen
		if wc.Flags&ib.WCGRH == 0 || wc.SrcQP != s.remote.QPN {
			return fmt.Errorf("pingpong: UD message from QP %#x (flags %v), expected QP %#x with a GRH", wc.SrcQP, wc.Flags, s.remote.QPN)
		}
	}
	if wc.ByteLen != want {
		return fmt.Errorf("pingpong: received %d bytes, expected %d", wc.ByteLen, want)
	}
	if !s.p.Check {
		return nil
	}
	if bad := badPages(s.data(), s.res.BadPages[:0]); len(bad) > 0 {
		s.res.BadPages = bad
		if s.out != nil {
			for _, pg := range bad {
				fmt.Fprintf(s.out, "invalid data in page %d\n", pg) // the stock client's line
			}
		}
		return fmt.Errorf("pingpong: --chk: message %d differs from the pattern in page(s) %v", s.res.Checked+1, bad)
	}
	s.res.Checked++
	return nil
}

// cqWaitStep bounds one sleep on a CQ that cannot notify.
const cqWaitStep = 20 * time.Millisecond

// close destroys what setup and connect made, in the order verbs requires.
func (s *session) close() error {
	var errs []error
	if s.qp != nil {
		errs = append(errs, s.qp.Destroy())
	}
	if s.ah != nil {
		errs = append(errs, s.ah.Destroy())
	}
	if s.mr != nil {
		errs = append(errs, s.mr.Dereg())
	}
	if s.cq != nil {
		errs = append(errs, s.cq.Destroy())
	}
	if s.pd != nil {
		errs = append(errs, s.pd.Dealloc())
	}
	if s.mem != nil {
		errs = append(errs, s.mem.Free())
	}
	return errors.Join(errs...)
}
