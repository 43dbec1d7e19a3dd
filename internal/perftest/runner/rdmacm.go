package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/perftest"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/verbs"
)

// Control QP of perftest -R: one send slot and ctrlRecvs receive slots of
// ctrlSlot bytes. perftest itself keeps one receive posted and works in
// lock step (each side sends only after reading the peer's message), so
// one would do; a few more cost nothing and tolerate a peer that sends
// two messages in a row.
const (
	ctrlSlot  = 4096
	ctrlRecvs = 4
)

// Data QPs of a -R run are dialled again after a REJ "invalid service ID"
// (the stock server listens for them only after its first zero handshake,
// so our REQ may come first): as perftest's rdma_cm_client_connection, up
// to 10 attempts 100 ms apart.
const (
	cmDataDialAttempts = 10
	cmDataDialDelay    = 100 * time.Millisecond
)

// RunCLICM is `softrnic perf -R`: as RunCLI, but the control channel is an
// RC connection made through rdma_cm on the device itself (Host.CM: an
// rdmacm.Agent on QP1 of a device of this process, or the daemon's agent
// through its client with --daemon), and the test's QPs are connected
// through it too; no TCP is used. The server listens on rdma_cm port
// p.Port (service ID 0x0000000001060000 | port), the client connects to
// p.Host there.
func RunCLICM(ctx context.Context, p perftest.Params, o CLIOptions, stdout io.Writer) (Result, error) {
	if !p.RDMACM {
		return Result{}, errors.New("perf: RunCLICM needs -R")
	}
	var peer netip.Addr
	if p.Host != "" {
		a, err := cmLookupHost(ctx, p.Host)
		if err != nil {
			return Result{}, err
		}
		peer = a
	}
	var r Result
	err := withHost(p, o, func(h Host) (err error) {
		if h.CM == nil {
			return errors.New("perf: -R: this RNIC runs no rdma_cm")
		}
		s := &cmSession{cm: h.CM, peer: peer, port: uint16(p.Port), dialFor: o.DialFor}
		t := New(h, p, p.Host != "", stdout)
		if !t.client {
			if s.l, err = s.cm.Listen(s.port, 0); err != nil {
				return fmt.Errorf("perf: rdma_cm listen on port %d: %w", p.Port, err)
			}
			defer func() { err = errors.Join(err, s.l.Close()) }()
			if p.Transport == perftest.UD {
				if s.udl, err = s.cm.ListenUD(s.port, 16); err != nil {
					return fmt.Errorf("perf: rdma_cm UD listen on port %d: %w", p.Port, err)
				}
				defer func() { err = errors.Join(err, s.udl.Close()) }()
			}
			if o.Listening != nil {
				o.Listening(cmAddr(s.port))
			}
		}
		r, err = t.execCM(ctx, s)
		if err != nil {
			return err
		}
		if p.JSON {
			return t.JSON().Write(stdout)
		}
		return nil
	})
	return r, err
}

// cmAddr is the address a -R server listens on, for CLIOptions.Listening.
type cmAddr uint16

func (a cmAddr) Network() string { return "rdma_cm" }
func (a cmAddr) String() string  { return ":" + strconv.Itoa(int(a)) }

// cmLookupHost reads the server as an address, or resolves its name.
func cmLookupHost(ctx context.Context, host string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap(), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(ips) == 0 {
		return netip.Addr{}, fmt.Errorf("perf: cannot resolve %q: %w", host, err)
	}
	return ips[0].Unmap(), nil
}

// cmSession is the rdma_cm side of a -R run: the CM (in process or the
// daemon's), the server's listeners (which take the control connection
// and then the test QPs', all on one port as perftest's), the client's
// peer.
type cmSession struct {
	cm      rdmacm.CM
	l       rdmacm.Listener
	udl     rdmacm.UDListener // -c UD: the test QPs' port in rdma_cm's UDP port space
	peer    netip.Addr
	port    uint16
	dialFor time.Duration
	ctrl    rdmacm.Conn
	conns   []rdmacm.Conn
}

// dial connects a QP from newQP to the server, trying again (with a new
// QP) after REJs for an unknown service ID (the server not listening yet)
// up to attempts times, delay apart.
func (s *cmSession) dial(ctx context.Context, newQP func() (verbs.QP, error), p *rdmacm.ConnParam, attempts int, delay time.Duration) (rdmacm.Conn, error) {
	for i := 1; ; i++ {
		qp, err := newQP()
		if err != nil {
			return nil, err
		}
		c, err := s.cm.Connect(ctx, qp, s.peer, s.port, p)
		if err == nil {
			return c, nil
		}
		if derr := qp.Destroy(); derr != nil {
			return nil, errors.Join(err, derr)
		}
		var rej *rdmacm.RejectedError
		if !errors.As(err, &rej) || rej.Reason != cm.RejInvalidServiceID || i >= attempts {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// connect makes one connection with a QP from newQP: dialled by the
// client, accepted by the server.
func (s *cmSession) connect(ctx context.Context, client bool, newQP func() (verbs.QP, error), p *rdmacm.ConnParam, attempts int, delay time.Duration) (rdmacm.Conn, error) {
	if client {
		return s.dial(ctx, newQP, p, attempts, delay)
	}
	return rdmacm.AcceptNext(ctx, s.l, newQP, p)
}

// disconnect ends the test QPs' connections and then the control
// connection (DREQ/DREP, perftest's order), each bounded in time: a peer
// gone already must not hold us.
func (s *cmSession) disconnect() {
	for _, c := range append(s.conns, s.ctrl) {
		if c == nil {
			continue
		}
		// Best effort, as perftest's: a peer that is gone or disconnected
		// first makes these fail, and the run's result stands.
		dctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_ = c.Disconnect(dctx)
		cancel()
		_ = c.Close()
	}
}

// execCM runs the test of a -R run: the control connection (accepted from
// s's listener or dialled to s's peer), perftest.RunCM over it, the test
// QPs connected through s, then the reports and the disconnections.
func (t *Test) execCM(ctx context.Context, s *cmSession) (_ Result, err error) {
	t.ctx = ctx
	defer func() { err = errors.Join(err, t.close()) }()
	if t.dev == nil {
		return t.res, errors.New("perf: no device")
	}
	if t.p.Transport != perftest.RC && t.p.Transport != perftest.UD {
		return t.res, errors.New("perf: -R runs RC or UD QPs only")
	}
	t.udDatum = t.p.Transport == perftest.UD
	if err := t.cmPickGID(); err != nil {
		return t.res, err
	}
	ch, err := newCMChannel(t.dev)
	if err != nil {
		return t.res, err
	}
	defer func() { err = errors.Join(err, ch.close()) }()
	// The connections end before the channel's QP, CQ, MR and PD go.
	defer s.disconnect()
	attempts := max(1, int(s.dialFor/cmDataDialDelay))
	if s.ctrl, err = s.connect(ctx, t.client, ch.newQP, ch.params(), attempts, cmDataDialDelay); err != nil {
		return t.res, fmt.Errorf("perf: rdma_cm control connection: %w", err)
	}
	ch.conn, ch.qp = s.ctrl, s.ctrl.QP()
	mtu := perftest.MTUFromBytes(int(t.dev.Query().ActiveMTU))
	if t.p.MTU != 0 {
		mtu = min(mtu, t.p.MTU)
	}
	cfg := perftest.Config{Test: t.p.Test, Client: t.client, MTU: mtu, PageSize: 4096, CacheLine: 64}
	out, err := perftest.RunCM(ctx, ch, cfg, t.gidIdx, &cmLocal{Test: t, s: s})
	if err != nil {
		return t.res, err
	}
	t.snapshotCC() // --dcqcn's per-QP state, while the QPs exist
	return t.cmFinish(out)
}

// cmPickGID sets the GID of our records from -x, as Exec does.
func (t *Test) cmPickGID() error {
	t.gidIdx = t.p.GIDIndex
	gid, err := t.h.Iface.GID(t.p.GIDIndex)
	if err != nil {
		return err
	}
	if t.gidIdx < 0 {
		for i, g := range t.h.Iface.GIDs {
			if g == gid {
				t.gidIdx = i
				break
			}
		}
	}
	t.gid = gid
	return nil
}

// cmFinish prints the passive server's report and runs --verify, as Exec.
func (t *Test) cmFinish(out perftest.Outcome) (Result, error) {
	if out.PeerReport != nil && !t.client {
		t.res.BW = append(t.res.BW, *out.PeerReport)
		t.print(perftest.FormatBW(*out.PeerReport, t.p.ReportGbits))
		t.print(perftest.ResultLine)
	}
	if t.p.Verify {
		if err := t.verifyAfter(out); err != nil {
			return t.res, err
		}
		t.res.Verify = true
	}
	return t.res, nil
}

// cmLocal is the device side of a -R test: the QPs come from the CM.
type cmLocal struct {
	*Test
	s  *cmSession
	ud []udRemote // -c UD: the peer QPs the CM named, by QP
}

// ConnectQPs implements perftest.LocalCM: the MR as Dests makes it, then
// one CM connection per QP on the same port as the control connection,
// with perftest's conn_param (retry and RNR retry 7; responder resources
// and initiator depth -o for READ and atomics, 0 otherwise).
func (c *cmLocal) ConnectQPs(n perftest.Negotiated) error {
	t := c.Test
	if t.udDatum {
		return c.connectUD(n)
	}
	if err := t.setupMR(n); err != nil {
		return err
	}
	for i := 0; i < t.p.QPs; i++ {
		// perftest's record carries a PSN of its own drawing that no QP
		// uses with -R (the CM chose the QPs' PSNs): so does ours.
		q, sq, rq, err := t.newQP(i)
		if err != nil {
			return err
		}
		// Our QP, which the CM connects (as rdma_connect and
		// rdma_accept drive the application's QP).
		cp := &rdmacm.ConnParam{Access: t.allowed &^ ib.LocalWrite, RetryCount: 7, RNRRetry: 7}
		if t.p.Verb == perftest.Read || t.p.Verb == perftest.Atomic {
			cp.ResponderResources = uint8(min(t.p.OutReads, 255))
			cp.InitiatorDepth = cp.ResponderResources
		}
		newQP := func() (verbs.QP, error) { return t.pd.CreateQP(t.qpAttr(ib.RC, q.cq, sq, rq)) }
		conn, err := c.s.connect(t.ctx, t.client, newQP, cp, cmDataDialAttempts, cmDataDialDelay)
		if err != nil {
			return errors.Join(fmt.Errorf("perf: rdma_cm connection of QP %d: %w", i, err), q.cq.Destroy())
		}
		c.s.conns = append(c.s.conns, conn)
		q.qp = conn.QP()
		t.qps = append(t.qps, q)
		t.qpns = append(t.qpns, q.qpn())
	}
	return nil
}

// Dests implements perftest.Local for -R: the records of the QPs the CM
// connected.
func (c *cmLocal) Dests(n perftest.Negotiated) ([]perftest.Dest, error) {
	t := c.Test
	var dests []perftest.Dest
	for _, q := range t.qps {
		d := perftest.Dest{OutReads: uint16(t.p.OutReads), QPN: q.qpn(), PSN: q.psn,
			RKey: t.mr.RKey(), VAddr: q.va, GID: perftest.GIDFromAddr(t.gid)}
		if t.udDatum {
			d.RKey, d.VAddr = 0, 0 // no remote access to a UD QP's memory
		}
		dests = append(dests, d)
	}
	perftest.WriteBanner(writerOrDiscard(t), t.info())
	for _, d := range dests {
		perftest.WriteDest(writerOrDiscard(t), "local", d, t.p.Verb)
	}
	return dests, nil
}

// Connect implements perftest.Local for -R: the QPs are in RTS already;
// the peer's records give the rkeys and addresses of its buffers.
func (c *cmLocal) Connect(remote []perftest.Dest) error {
	c.remote = remote
	c.res.Peer = remote[0].Addr()
	for i := range c.ud {
		// UD sends go to the QP the CM named (perftest's cma node
		// remote_qpn), not to the record's.
		if i < len(c.remote) && c.ud[i].qpn != 0 {
			c.remote[i].QPN = c.ud[i].qpn
		}
	}
	for _, d := range remote {
		perftest.WriteDest(writerOrDiscard(c.Test), "remote", d, c.p.Verb)
	}
	return nil
}

// cmChannel is perftest.MsgChannel on the control QP: slot 0 of its MR is
// the send buffer, slots 1..ctrlRecvs the receives (WR ID = slot). It runs
// on either RNIC: in process or through the daemon.
type cmChannel struct {
	pd    verbs.PD
	cq    verbs.CQ
	mem   verbs.Mem
	mr    verbs.MR
	conn  rdmacm.Conn
	qp    verbs.QP
	wcs   [ctrlRecvs + 2]ib.WC
	recvd []ib.WC // receive completions not yet taken, in order
	sent  bool
	// awaitSend: a Send is waiting for its completion (see wait).
	awaitSend bool
	// failed is a failed completion met by a wait that also brought
	// what the caller waited for: reported by the next wait.
	failed error
	sge    [1]ib.SGE
	swr    [1]verbs.SendWR
}

func newCMChannel(dev verbs.Device) (*cmChannel, error) {
	ch := &cmChannel{}
	fail := func(err error) (*cmChannel, error) { return nil, errors.Join(err, ch.close()) }
	var err error
	if ch.pd, err = dev.AllocPD(); err != nil {
		return fail(err)
	}
	if ch.cq, err = dev.CreateCQ(4 * (ctrlRecvs + 2)); err != nil {
		return fail(err)
	}
	if ch.mem, err = dev.AllocMem((ctrlRecvs + 1) * ctrlSlot); err != nil {
		return fail(err)
	}
	if ch.mr, err = ch.pd.RegMR(ch.mem, 0, (ctrlRecvs+1)*ctrlSlot, 0, ib.LocalWrite); err != nil {
		return fail(err)
	}
	return ch, nil
}

// close frees what newCMChannel and newQP made.
func (ch *cmChannel) close() error {
	var errs []error
	if ch.qp != nil {
		errs = append(errs, ch.qp.Destroy())
	}
	if ch.mr != nil {
		errs = append(errs, ch.mr.Dereg())
	}
	if ch.mem != nil {
		errs = append(errs, ch.mem.Free())
	}
	if ch.cq != nil {
		errs = append(errs, ch.cq.Destroy())
	}
	if ch.pd != nil {
		errs = append(errs, ch.pd.Dealloc())
	}
	return errors.Join(errs...)
}

// params are the control QP's connection parameters: perftest's comm QP
// (SEND only, no READ resources, retry and RNR retry 7).
func (ch *cmChannel) params() *rdmacm.ConnParam {
	return &rdmacm.ConnParam{RetryCount: 7, RNRRetry: 7}
}

// newQP makes the control QP (RC, SEND only) with its receives posted in
// INIT, before the CM exchange goes on, so that the peer's first SEND
// finds one.
func (ch *cmChannel) newQP() (verbs.QP, error) {
	qp, err := ch.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: ch.cq, RecvCQ: ch.cq,
		Cap: ib.QPCaps{MaxSendWR: 2, MaxRecvWR: ctrlRecvs, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, err
	}
	if err := rdmacm.InitQP(qp, ch.params()); err != nil {
		return nil, errors.Join(err, qp.Destroy())
	}
	for slot := uint64(1); slot <= ctrlRecvs; slot++ {
		if _, err := qp.PostRecv([]verbs.RecvWR{ch.recvWR(slot)}); err != nil {
			return nil, errors.Join(err, qp.Destroy())
		}
	}
	return qp, nil
}

func (ch *cmChannel) recvWR(slot uint64) verbs.RecvWR {
	return verbs.RecvWR{ID: slot, SG: []ib.SGE{{Addr: ch.mr.IOVA() + slot*ctrlSlot, Length: ctrlSlot, LKey: ch.mr.LKey()}}}
}

// ctrlWaitStep bounds one sleep of wait on a CQ that cannot notify (the
// daemon's): the context and the connection's end are checked that often.
const ctrlWaitStep = 20 * time.Millisecond

// wait polls the control CQ once, blocking until a completion, the end of
// ctx or of the connection.
func (ch *cmChannel) wait(ctx context.Context) error {
	if ch.failed != nil {
		return ch.failed
	}
	for {
		n := ch.cq.Poll(ch.wcs[:])
		var failed error
		for _, w := range ch.wcs[:n] {
			if w.Status != ib.Success {
				// The peer may disconnect as soon as it has our last
				// message: our posted receives are then flushed in the
				// same poll as that SEND's completion. A flushed receive
				// fails only a Recv; the SEND's own status decides Send.
				// (Through the daemon a connection's end shows only so.)
				if failed == nil && !(ch.awaitSend && w.IsRecv && w.Status == ib.WRFlushErr) {
					failed = fmt.Errorf("perf: control QP: work request %d completed with status %v", w.ID, w.Status)
				}
				continue
			}
			if w.IsRecv {
				ch.recvd = append(ch.recvd, w)
			} else {
				ch.sent = true
			}
		}
		if failed != nil {
			// The peer's last message and the flush of our other
			// receives (it disconnected at once) can come in one poll:
			// the message is still delivered, the failure reported
			// after.
			if len(ch.recvd) > 0 && !ch.awaitSend {
				ch.failed = failed
				return nil
			}
			return failed
		}
		if n > 0 {
			return nil
		}
		if nt, ok := ch.cq.(verbs.Notifier); ok {
			select {
			case <-nt.Notify():
			case <-ctx.Done():
				return ctx.Err()
			case <-ch.conn.Done():
				return fmt.Errorf("perf: control connection ended")
			}
			continue
		}
		if err := ch.cq.Wait(ctrlWaitStep); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// Send implements perftest.MsgChannel: one signaled SEND from slot 0,
// waited for as perftest's rdma_write_data does.
func (ch *cmChannel) Send(ctx context.Context, b []byte) error {
	if len(b) > ctrlSlot {
		return fmt.Errorf("perf: control message of %d bytes", len(b))
	}
	copy(ch.mem.Bytes(), b)
	ch.sge[0] = ib.SGE{Addr: ch.mr.IOVA(), Length: uint32(len(b)), LKey: ch.mr.LKey()}
	ch.sent, ch.awaitSend = false, true
	defer func() { ch.awaitSend = false }()
	ch.swr[0] = verbs.SendWR{ID: 0, Opcode: ib.Send, Flags: ib.Signaled, SG: ch.sge[:]}
	if _, err := ch.qp.PostSend(ch.swr[:]); err != nil {
		return fmt.Errorf("perf: control QP: post: %w", err)
	}
	for !ch.sent {
		if err := ch.wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Recv implements perftest.MsgChannel: the next message, its receive
// posted again at once.
func (ch *cmChannel) Recv(ctx context.Context, b []byte) (int, error) {
	for len(ch.recvd) == 0 {
		if err := ch.wait(ctx); err != nil {
			return 0, err
		}
	}
	w := ch.recvd[0]
	ch.recvd = ch.recvd[1:]
	if w.ID < 1 || w.ID > ctrlRecvs {
		return 0, fmt.Errorf("perf: control QP: receive with WR ID %d", w.ID)
	}
	n := int(w.ByteLen)
	if n > len(b) {
		return 0, fmt.Errorf("perf: control message of %d bytes, at most %d expected", n, len(b))
	}
	copy(b, ch.mem.Bytes()[w.ID*ctrlSlot:w.ID*ctrlSlot+uint64(n)])
	if _, err := ch.qp.PostRecv([]verbs.RecvWR{ch.recvWR(w.ID)}); err != nil {
		return 0, fmt.Errorf("perf: control QP: post receive: %w", err)
	}
	return n, nil
}
