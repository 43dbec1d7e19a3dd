package examples

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/verbs"
)

// Protocol constants of the examples.
const (
	DefaultPort = 7471 // rdma_server -p, rdma_client -p
	MsgSize     = 16   // send_msg and recv_msg
)

// endpoint is one side's QP resources: a 16-byte receive buffer, sends
// inline (max_inline_data 16), every WR signaled (sq_sig_all), one WR per
// queue.
type endpoint struct {
	dev  verbs.Device
	pd   verbs.PD
	cq   verbs.CQ
	qp   verbs.QP
	mem  verbs.Mem
	recv verbs.MR
}

func newEndpoint(dev verbs.Device) (*endpoint, error) {
	e := &endpoint{dev: dev}
	var err error
	if e.pd, err = dev.AllocPD(); err != nil {
		return e, err
	}
	if e.cq, err = dev.CreateCQ(4); err != nil {
		return e, err
	}
	if e.mem, err = dev.AllocMem(MsgSize); err != nil {
		return e, err
	}
	e.recv, err = e.pd.RegMR(e.mem, 0, MsgSize, 0, ib.LocalWrite)
	return e, err
}

// close releases what the endpoint made, the QP first.
func (e *endpoint) close() error {
	var errs []error
	if e.qp != nil {
		errs = append(errs, e.qp.Destroy())
	}
	if e.recv != nil {
		errs = append(errs, e.recv.Dereg())
	}
	if e.mem != nil {
		errs = append(errs, e.mem.Free())
	}
	if e.cq != nil {
		errs = append(errs, e.cq.Destroy())
	}
	if e.pd != nil {
		errs = append(errs, e.pd.Dealloc())
	}
	return errors.Join(errs...)
}

// params is rdma_connect/rdma_accept's defaults (NULL conn_param):
// retries 7, READ/atomic limits as large as the device allows.
func (e *endpoint) params() *rdmacm.ConnParam {
	rd := uint8(min(e.dev.Query().MaxQPRdAtom, 255))
	return &rdmacm.ConnParam{ResponderResources: rd, InitiatorDepth: rd, RetryCount: 7, RNRRetry: 7}
}

// newQP is rdma_create_ep's QP, its receive posted (in INIT) before the
// connection. The endpoint keeps the last one made (AcceptNext destroys
// those of requests that expired).
func (e *endpoint) newQP() (verbs.QP, error) {
	qp, err := e.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: e.cq, RecvCQ: e.cq, SigAll: true,
		Cap: ib.QPCaps{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: MsgSize}})
	if err != nil {
		return nil, err
	}
	e.qp = qp
	if err := rdmacm.InitQP(qp, e.params()); err != nil {
		return nil, err
	}
	if _, err := qp.PostRecv([]verbs.RecvWR{{ID: 1, SG: []ib.SGE{{Addr: e.recv.IOVA(), Length: MsgSize, LKey: e.recv.LKey()}}}}); err != nil {
		return nil, err
	}
	return qp, nil
}

// cqWaitStep bounds one sleep on a CQ that cannot notify (the daemon's).
const cqWaitStep = 20 * time.Millisecond

// wait returns the next completion, receive or send as asked (the other
// kind is an error here: each side has one of each, in a fixed order).
func (e *endpoint) wait(ctx context.Context, c rdmacm.Conn, recv bool) error {
	var wc [1]ib.WC
	var notify <-chan struct{}
	if n, ok := e.cq.(verbs.Notifier); ok {
		notify = n.Notify()
	}
	for got := false; !got; {
		if e.cq.Poll(wc[:]) == 1 {
			break
		}
		if notify == nil {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := e.cq.Wait(cqWaitStep); err != nil {
				return err
			}
			continue
		}
		select {
		case <-notify:
		case <-c.Done():
			if got = e.cq.Poll(wc[:]) == 1; !got {
				return fmt.Errorf("connection ended: %w", c.Err())
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	switch {
	case wc[0].Status != ib.Success:
		return fmt.Errorf("%v completion: %v", wc[0].Opcode, wc[0].Status)
	case wc[0].IsRecv != recv:
		return errors.New("completion out of order")
	case recv && wc[0].ByteLen != MsgSize:
		return fmt.Errorf("received %d bytes, want %d", wc[0].ByteLen, MsgSize)
	}
	return nil
}

func send(q verbs.QP, msg []byte) error {
	_, err := q.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.Send, Flags: ib.Signaled | ib.Inline, InlineData: msg}})
	return err
}

// Server is rdma_server on RNIC dev with rdma_cm cm (an rdmacm.Agent on a
// device of this process, or a daemon's client): it serves one client on
// port and returns. It prints "rdma_server: start" and "rdma_server: end
// N" as the stock tool. ready, if set, is called once it listens.
func Server(ctx context.Context, dev verbs.Device, cm rdmacm.CM, port uint16, out io.Writer, ready func()) (err error) {
	fmt.Fprintln(out, "rdma_server: start")
	defer func() { fmt.Fprintf(out, "rdma_server: end %d\n", exitCode(err)) }()
	e, err := newEndpoint(dev)
	defer func() { err = errors.Join(err, e.close()) }()
	if err != nil {
		return err
	}
	ln, err := cm.Listen(port, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, ln.Close()) }()
	if ready != nil {
		ready()
	}
	c, err := rdmacm.AcceptNext(ctx, ln, e.newQP, e.params())
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	if err := e.wait(ctx, c, true); err != nil {
		return err
	}
	var msg [MsgSize]byte // the stock server answers with its zeroed send_msg
	if err := send(c.QP(), msg[:]); err != nil {
		return err
	}
	if err := e.wait(ctx, c, false); err != nil {
		return err
	}
	return c.Disconnect(ctx)
}

// Client is rdma_client on RNIC dev with rdma_cm cm: connect to
// addr:port, SEND 16 bytes, wait for the answer, disconnect. It prints
// "rdma_client: start" and "rdma_client: end N" as the stock tool.
func Client(ctx context.Context, dev verbs.Device, cm rdmacm.CM, addr netip.Addr, port uint16, out io.Writer) (err error) {
	fmt.Fprintln(out, "rdma_client: start")
	defer func() { fmt.Fprintf(out, "rdma_client: end %d\n", exitCode(err)) }()
	e, err := newEndpoint(dev)
	defer func() { err = errors.Join(err, e.close()) }()
	if err != nil {
		return err
	}
	qp, err := e.newQP()
	if err != nil {
		return err
	}
	c, err := cm.Connect(ctx, qp, addr, port, e.params())
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	var msg [MsgSize]byte
	if err := send(c.QP(), msg[:]); err != nil {
		return err
	}
	if err := e.wait(ctx, c, false); err != nil {
		return err
	}
	if err := e.wait(ctx, c, true); err != nil {
		return err
	}
	return c.Disconnect(ctx)
}

// exitCode is what the stock tools print as their end status: 0, or -1
// for a failure (their ret from a failed call).
func exitCode(err error) int {
	if err != nil {
		return -1
	}
	return 0
}
