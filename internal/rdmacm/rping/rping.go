package rping

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/ib"
	cmrping "github.com/softrnic/softrnic/internal/cm/rping"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/verbs"
)

// Options are rping's flags.
type Options struct {
	Port     uint16 // -p (cmrping.DefaultPort if 0)
	Count    int    // -C: pings (client; 0 = until stopped)
	Size     int    // -S: ping buffer size (cmrping.DefaultSize if 0)
	Verbose  bool   // -v: print each ping's data
	Validate bool   // -V: check each ping's data
	Out      io.Writer
}

// ErrMismatch is a ping whose data came back different (rping -V's "data
// mismatch!").
var ErrMismatch = errors.New("rping: data mismatch")

func (o *Options) norm() error {
	if o.Port == 0 {
		o.Port = cmrping.DefaultPort
	}
	if o.Size == 0 {
		o.Size = cmrping.DefaultSize
	}
	if o.Size < cmrping.MinSize || o.Size > cmrping.MaxSize {
		return fmt.Errorf("rping: size %d out of range [%d, %d]", o.Size, cmrping.MinSize, cmrping.MaxSize)
	}
	if o.Count < 0 {
		return fmt.Errorf("rping: negative count %d", o.Count)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	return nil
}

// endpoint is one side's RNIC objects.
type endpoint struct {
	dev     verbs.Device
	pd      verbs.PD
	cq      verbs.CQ
	qp      verbs.QP // the connection's, once made
	recvMem verbs.Mem
	recv    verbs.MR // one rping_rdma_info
	wc      [8]ib.WC
	mems    []verbs.Mem
	mrs     []verbs.MR
	rsg     [1]ib.SGE
	rwr     [1]verbs.RecvWR
	swr     [1]verbs.SendWR
	sge     [1]ib.SGE
	info    [cmrping.InfoSize]byte
}

func newEndpoint(dev verbs.Device) (*endpoint, error) {
	e := &endpoint{dev: dev}
	var err error
	if e.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if e.cq, err = dev.CreateCQ(16); err != nil {
		return e, err
	}
	e.recvMem, e.recv, err = e.buffer(cmrping.InfoSize, ib.LocalWrite)
	return e, err
}

// buffer allocates and registers n bytes with the given access.
func (e *endpoint) buffer(n int, access ib.Access) (verbs.Mem, verbs.MR, error) {
	m, err := e.dev.AllocMem(n)
	if err != nil {
		return nil, nil, err
	}
	e.mems = append(e.mems, m)
	mr, err := e.pd.RegMR(m, 0, n, 0, access)
	if err != nil {
		return nil, nil, err
	}
	e.mrs = append(e.mrs, mr)
	return m, mr, nil
}

// close releases the endpoint once its connection is gone.
func (e *endpoint) close() error {
	var errs []error
	if e.qp != nil {
		errs = append(errs, e.qp.Destroy())
	}
	for _, mr := range e.mrs {
		errs = append(errs, mr.Dereg())
	}
	for _, m := range e.mems {
		errs = append(errs, m.Free())
	}
	if e.cq != nil {
		errs = append(errs, e.cq.Destroy())
	}
	if e.pd != nil {
		errs = append(errs, e.pd.Dealloc())
	}
	return errors.Join(errs...)
}

// params is rping's rdma_conn_param: one READ in flight each way,
// retries 7.
func (e *endpoint) params() *rdmacm.ConnParam {
	return &rdmacm.ConnParam{Access: ib.LocalWrite | ib.RemoteRead | ib.RemoteWrite,
		ResponderResources: cmrping.ResponderResources, InitiatorDepth: cmrping.InitiatorDepth,
		RetryCount: cmrping.RetryCount, RNRRetry: cmrping.RNRRetry}
}

// newQP makes rping's QP and posts its one receive (in INIT, before the
// connection: the peer's first SEND must find it). The endpoint keeps the
// last one made (AcceptNext destroys those of requests that expired).
func (e *endpoint) newQP() (verbs.QP, error) {
	qp, err := e.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: ib.QPCaps{MaxSendWR: cmrping.RQDepth * 2, MaxRecvWR: cmrping.RQDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: cmrping.InfoSize}})
	if err != nil {
		return nil, err
	}
	e.qp = qp
	if err := rdmacm.InitQP(qp, e.params()); err != nil {
		return nil, err
	}
	if err := e.postRecv(qp); err != nil {
		return nil, err
	}
	return qp, nil
}

func (e *endpoint) postRecv(q verbs.QP) error {
	e.rsg[0] = ib.SGE{Addr: e.recv.IOVA(), Length: cmrping.InfoSize, LKey: e.recv.LKey()}
	e.rwr[0] = verbs.RecvWR{ID: 1, SG: e.rsg[:]}
	_, err := q.PostRecv(e.rwr[:])
	return err
}

func (e *endpoint) sendInfo(q verbs.QP, info cmrping.Info) error {
	info.Encode(e.info[:])
	e.swr[0] = verbs.SendWR{ID: 2, Opcode: ib.Send, Flags: ib.Signaled | ib.Inline, InlineData: e.info[:]}
	_, err := q.PostSend(e.swr[:])
	return err
}

// rdma posts rping's READ or WRITE of n bytes between mr and the peer's
// buffer.
func (e *endpoint) rdma(q verbs.QP, id uint64, op ib.WROpcode, mr verbs.MR, n uint32, remote cmrping.Info) error {
	e.sge[0] = ib.SGE{Addr: mr.IOVA(), Length: n, LKey: mr.LKey()}
	e.swr[0] = verbs.SendWR{ID: id, Opcode: op, Flags: ib.Signaled, SG: e.sge[:], RemoteAddr: remote.Buf, RKey: remote.RKey}
	_, err := q.PostSend(e.swr[:])
	return err
}

// cqWait bounds one sleep on the CQ: ctx's end is seen within it.
const cqWait = 10 * time.Millisecond

// next waits for the next completion of c's QP. It returns errDone when
// the connection is over (the peer disconnected).
func (e *endpoint) next(ctx context.Context, c rdmacm.Conn) (ib.WC, error) {
	for {
		if e.cq.Poll(e.wc[:1]) == 1 {
			return e.wc[0], nil
		}
		select {
		case <-c.Done():
			if e.cq.Poll(e.wc[:1]) == 1 {
				return e.wc[0], nil
			}
			return ib.WC{}, errDone
		case <-ctx.Done():
			return ib.WC{}, ctx.Err()
		default:
		}
		if err := e.cq.Wait(cqWait); err != nil {
			return ib.WC{}, err
		}
	}
}

var errDone = errors.New("rping: connection closed")

// cstring is buf up to its first NUL, as rping prints it.
func cstring(buf []byte) []byte {
	if i := bytes.IndexByte(buf, 0); i >= 0 {
		return buf[:i]
	}
	return buf
}

// Client connects to addr through agent a (on its device) and runs
// o.Count pings, then disconnects.
func Client(ctx context.Context, a *rdmacm.Agent, addr netip.Addr, o Options) error {
	return RunClient(ctx, a.Device(), a, addr, o)
}

// Server listens on o.Port through agent a (on its device), serves one
// client until it disconnects and returns. ready, if not nil, is called
// once it listens.
func Server(ctx context.Context, a *rdmacm.Agent, o Options, ready func()) error {
	return RunServer(ctx, a.Device(), a, o, ready)
}

// RunClient is Client on RNIC dev with rdma_cm cm.
func RunClient(ctx context.Context, dev verbs.Device, cm rdmacm.CM, addr netip.Addr, o Options) (err error) {
	if err := o.norm(); err != nil {
		return err
	}
	e, err := newEndpoint(dev)
	defer func() { err = errors.Join(err, e.close()) }()
	if err != nil {
		return err
	}
	acc := ib.LocalWrite | ib.RemoteRead | ib.RemoteWrite
	startMem, start, err := e.buffer(o.Size, acc)
	// Memory from the RNIC may be longer than asked (whole pages through
	// the daemon): rping's buffers are the first o.Size bytes.
	if err != nil {
		return err
	}
	sinkMem, sink, err := e.buffer(o.Size, acc)
	if err != nil {
		return err
	}
	qp, err := e.newQP()
	if err != nil {
		return err
	}
	conn, err := cm.Connect(ctx, qp, addr, o.Port, e.params())
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, conn.Close()) }()
	q := conn.QP()
	cl := cmrping.Client{Count: o.Count,
		Start: cmrping.Info{Buf: start.IOVA(), RKey: start.RKey(), Size: uint32(o.Size)},
		Sink:  cmrping.Info{Buf: sink.IOVA(), RKey: sink.RKey(), Size: uint32(o.Size)}}
	startBuf, sinkBuf := startMem.Bytes()[:o.Size], sinkMem.Bytes()[:o.Size]
	cmrping.FillPing(startBuf, 0)
	if err := e.sendInfo(q, cl.Begin().Info); err != nil {
		return err
	}
	for {
		wc, err := e.next(ctx, conn)
		if err != nil {
			if errors.Is(err, errDone) {
				return fmt.Errorf("rping: server disconnected during ping %d", cl.Ping())
			}
			return err
		}
		if wc.Status != ib.Success {
			return fmt.Errorf("rping: %v completion: %v", wc.Opcode, wc.Status)
		}
		if !wc.IsRecv {
			continue
		}
		msg := append([]byte(nil), e.recvMem.Bytes()[:wc.ByteLen]...)
		if err := e.postRecv(q); err != nil {
			return err
		}
		ping := cl.Ping()
		act, err := cl.OnRecv(msg)
		if err != nil {
			return err
		}
		if cl.Ping() != ping || act.Kind == cmrping.ActDone {
			// Ping done: the server has written the data back.
			if o.Validate && !bytes.Equal(startBuf, sinkBuf) {
				fmt.Fprintf(o.Out, "data mismatch!\n")
				return fmt.Errorf("%w in ping %d", ErrMismatch, ping)
			}
			if o.Verbose {
				fmt.Fprintf(o.Out, "ping data: %s\n", cstring(sinkBuf))
			}
			clear(sinkBuf)
		}
		switch act.Kind {
		case cmrping.ActDone:
			return conn.Disconnect(ctx)
		case cmrping.ActSendInfo:
			if act.Info == cl.Start {
				cmrping.FillPing(startBuf, cl.Ping())
			}
			if err := e.sendInfo(q, act.Info); err != nil {
				return err
			}
		default:
			// ActNone: wait for the next completion. (READ and WRITE
			// are the server's.)
		}
	}
}

// RunServer is Server on RNIC dev with rdma_cm cm.
func RunServer(ctx context.Context, dev verbs.Device, cm rdmacm.CM, o Options, ready func()) (err error) {
	if err := o.norm(); err != nil {
		return err
	}
	e, err := newEndpoint(dev)
	defer func() { err = errors.Join(err, e.close()) }()
	if err != nil {
		return err
	}
	bufMem, buf, err := e.buffer(o.Size, ib.LocalWrite|ib.RemoteRead|ib.RemoteWrite)
	if err != nil {
		return err
	}
	ln, err := cm.Listen(o.Port, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, ln.Close()) }()
	if ready != nil {
		ready()
	}
	conn, err := rdmacm.AcceptNext(ctx, ln, e.newQP, e.params())
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, conn.Close()) }()
	q := conn.QP()
	srv := cmrping.Server{Buf: bufMem.Bytes()[:o.Size]}
	for {
		wc, err := e.next(ctx, conn)
		if errors.Is(err, errDone) {
			return nil // the client disconnected: rping's normal end
		}
		if err != nil {
			return err
		}
		if wc.Status != ib.Success {
			if wc.Status == ib.WRFlushErr {
				return nil
			}
			return fmt.Errorf("rping: %v completion: %v", wc.Opcode, wc.Status)
		}
		var act cmrping.Action
		switch {
		case wc.IsRecv:
			msg := append([]byte(nil), e.recvMem.Bytes()[:wc.ByteLen]...)
			if err := e.postRecv(q); err != nil {
				return err
			}
			if act, err = srv.OnRecv(msg); err != nil {
				return err
			}
		case wc.Opcode == ib.WCRDMARead || wc.Opcode == ib.WCRDMAWrite:
			if wc.Opcode == ib.WCRDMARead && o.Verbose {
				fmt.Fprintf(o.Out, "server ping data: %s\n", cstring(bufMem.Bytes()[:o.Size]))
			}
			if act, err = srv.OnComplete(); err != nil {
				return err
			}
		default:
			continue // our "go ahead" SENDs
		}
		switch act.Kind {
		case cmrping.ActSendInfo:
			err = e.sendInfo(q, act.Info)
		case cmrping.ActRDMARead:
			err = e.rdma(q, 3, ib.RDMARead, buf, act.Remote.Size, act.Remote)
		case cmrping.ActRDMAWrite:
			err = e.rdma(q, 4, ib.RDMAWrite, buf, uint32(act.Len), act.Remote)
		default:
			// ActNone: wait for the client. (ActDone is the client's.)
		}
		if err != nil {
			return err
		}
	}
}
