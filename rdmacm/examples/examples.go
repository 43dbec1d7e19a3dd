// Package examples runs librdmacm's rdma_server and rdma_client examples
// over an rdmacm.Agent, so that `softrnic rdma_server` and `softrnic
// rdma_client` interoperate with the stock ones on rxe or a ConnectX: the
// client connects (rdma_connect with default parameters), SENDs a 16-byte
// message and waits for the server's 16-byte answer; the server takes one
// request, receives the message, answers it and disconnects.
package examples

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
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
	pd   *rnic.PD
	cq   *rnic.CQ
	recv *rnic.MR
}

func newEndpoint(dev *rnic.Device) (*endpoint, error) {
	e := &endpoint{pd: dev.AllocPD(), cq: dev.CreateCQ(4)}
	var err error
	e.recv, err = e.pd.RegMR(make([]byte, MsgSize), ib.LocalWrite)
	return e, err
}

// params is rdma_create_ep's QP and rdma_connect/rdma_accept's defaults
// (NULL conn_param): retries 7, READ/atomic limits as large as the device
// allows.
func (e *endpoint) params() *rdmacm.ConnParams {
	return &rdmacm.ConnParams{PD: e.pd, SendCQ: e.cq, RecvCQ: e.cq, MaxSendWR: 1, MaxRecvWR: 1,
		MaxInline: MsgSize, ResponderResources: rnic.MaxRdAtomic, InitiatorDepth: rnic.MaxRdAtomic,
		RetryCount: 7, RNRRetry: 7,
		Setup: func(q *rnic.QP) error {
			_, err := q.PostRecv(rnic.RecvWR{ID: 1, SG: []ib.SGE{{Addr: e.recv.IOVA(), Length: MsgSize, LKey: e.recv.LKey()}}})
			return err
		}}
}

// wait returns the next completion, receive or send as asked (the other
// kind is an error here: each side has one of each, in a fixed order).
func (e *endpoint) wait(ctx context.Context, c *rdmacm.Conn, recv bool) error {
	var wc [1]ib.WC
	for got := false; !got; {
		if e.cq.Poll(wc[:]) == 1 {
			break
		}
		select {
		case <-e.cq.Notify():
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

func send(q *rnic.QP, msg []byte) error {
	_, err := q.PostSend(rnic.SendWR{ID: 2, Opcode: ib.Send, Flags: ib.Signaled | ib.Inline, InlineData: msg})
	return err
}

// Server is rdma_server: it serves one client on port and returns. It
// prints "rdma_server: start" and "rdma_server: end N" as the stock tool.
// ready, if set, is called once it listens.
func Server(ctx context.Context, a *rdmacm.Agent, port uint16, out io.Writer, ready func()) (err error) {
	fmt.Fprintln(out, "rdma_server: start")
	defer func() { fmt.Fprintf(out, "rdma_server: end %d\n", exitCode(err)) }()
	e, err := newEndpoint(a.Device())
	if err != nil {
		return err
	}
	ln, err := a.Listen(port, 0)
	if err != nil {
		return err
	}
	defer ln.Close()
	if ready != nil {
		ready()
	}
	c, err := ln.Accept(ctx, e.params())
	if err != nil {
		return err
	}
	defer c.Close()
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

// Client is rdma_client: connect to addr:port, SEND 16 bytes, wait for the
// answer, disconnect. It prints "rdma_client: start" and "rdma_client:
// end N" as the stock tool.
func Client(ctx context.Context, a *rdmacm.Agent, addr netip.Addr, port uint16, out io.Writer) (err error) {
	fmt.Fprintln(out, "rdma_client: start")
	defer func() { fmt.Fprintf(out, "rdma_client: end %d\n", exitCode(err)) }()
	e, err := newEndpoint(a.Device())
	if err != nil {
		return err
	}
	c, err := a.Dial(ctx, addr, port, e.params())
	if err != nil {
		return err
	}
	defer c.Close()
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
