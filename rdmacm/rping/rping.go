// Package rping runs librdmacm's rping example over an rdmacm.Agent: the
// connection through the CM on QP1 (port 7174 by default), then rping's
// protocol (package cm/rping) on the RC QP, so that `softrnic rping` and
// a stock rping on rxe or a ConnectX talk to each other. The client
// advertises its start buffer, the server RDMA READs it, the client
// advertises its sink buffer, the server RDMA WRITEs the data back; with
// Validate the client compares the two, as `rping -V` does.
package rping

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"

	cmrping "github.com/softrnic/softrnic/cm/rping"
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

// endpoint is one side's verbs objects.
type endpoint struct {
	pd   *verbs.PD
	cq   *verbs.CQ
	recv *verbs.MR // one rping_rdma_info
	wc   [8]verbs.WC
}

func newEndpoint(dev *verbs.Device) (*endpoint, error) {
	e := &endpoint{pd: dev.AllocPD(), cq: dev.CreateCQ(16)}
	var err error
	e.recv, err = e.pd.RegMR(make([]byte, cmrping.InfoSize), verbs.LocalWrite)
	return e, err
}

// params is rping's QP and rdma_conn_param: one READ in flight each way,
// retries 7; one receive posted before the connection.
func (e *endpoint) params() *rdmacm.ConnParams {
	return &rdmacm.ConnParams{PD: e.pd, SendCQ: e.cq, RecvCQ: e.cq,
		MaxSendWR: cmrping.RQDepth * 2, MaxRecvWR: cmrping.RQDepth, MaxInline: cmrping.InfoSize,
		Access:             verbs.LocalWrite | verbs.RemoteRead | verbs.RemoteWrite,
		ResponderResources: cmrping.ResponderResources, InitiatorDepth: cmrping.InitiatorDepth,
		RetryCount: cmrping.RetryCount, RNRRetry: cmrping.RNRRetry,
		Setup: e.postRecv}
}

func (e *endpoint) postRecv(q *verbs.QP) error {
	_, err := q.PostRecv(verbs.RecvWR{ID: 1, SG: []verbs.SGE{{Addr: e.recv.IOVA(), Length: cmrping.InfoSize, LKey: e.recv.LKey()}}})
	return err
}

func sendInfo(q *verbs.QP, info cmrping.Info) error {
	var b [cmrping.InfoSize]byte
	info.Encode(b[:])
	_, err := q.PostSend(verbs.SendWR{ID: 2, Opcode: verbs.Send, Flags: verbs.Signaled | verbs.Inline, InlineData: b[:]})
	return err
}

// next waits for the next completion of c's QP. It returns errDone when
// the connection is over (the peer disconnected).
func (e *endpoint) next(ctx context.Context, c *rdmacm.Conn) (verbs.WC, error) {
	for {
		if e.cq.Poll(e.wc[:1]) == 1 {
			return e.wc[0], nil
		}
		select {
		case <-e.cq.Notify():
		case <-c.Done():
			if e.cq.Poll(e.wc[:1]) == 1 {
				return e.wc[0], nil
			}
			return verbs.WC{}, errDone
		case <-ctx.Done():
			return verbs.WC{}, ctx.Err()
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

// Client connects to addr and runs o.Count pings, then disconnects.
func Client(ctx context.Context, a *rdmacm.Agent, addr netip.Addr, o Options) error {
	if err := o.norm(); err != nil {
		return err
	}
	e, err := newEndpoint(a.Device())
	if err != nil {
		return err
	}
	acc := verbs.LocalWrite | verbs.RemoteRead | verbs.RemoteWrite
	start, err := e.pd.RegMR(make([]byte, o.Size), acc)
	if err != nil {
		return err
	}
	sink, err := e.pd.RegMR(make([]byte, o.Size), acc)
	if err != nil {
		return err
	}
	conn, err := a.Dial(ctx, addr, o.Port, e.params())
	if err != nil {
		return err
	}
	defer conn.Close()
	q := conn.QP()
	cl := cmrping.Client{Count: o.Count,
		Start: cmrping.Info{Buf: start.IOVA(), RKey: start.RKey(), Size: uint32(o.Size)},
		Sink:  cmrping.Info{Buf: sink.IOVA(), RKey: sink.RKey(), Size: uint32(o.Size)}}
	cmrping.FillPing(start.Bytes(), 0)
	if err := sendInfo(q, cl.Begin().Info); err != nil {
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
		if wc.Status != verbs.Success {
			return fmt.Errorf("rping: %v completion: %v", wc.Opcode, wc.Status)
		}
		if !wc.IsRecv {
			continue
		}
		msg := append([]byte(nil), e.recv.Bytes()[:wc.ByteLen]...)
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
			if o.Validate && !bytes.Equal(start.Bytes(), sink.Bytes()) {
				fmt.Fprintf(o.Out, "data mismatch!\n")
				return fmt.Errorf("%w in ping %d", ErrMismatch, ping)
			}
			if o.Verbose {
				fmt.Fprintf(o.Out, "ping data: %s\n", cstring(sink.Bytes()))
			}
			clear(sink.Bytes())
		}
		switch act.Kind {
		case cmrping.ActDone:
			return conn.Disconnect(ctx)
		case cmrping.ActSendInfo:
			if act.Info == cl.Start {
				cmrping.FillPing(start.Bytes(), cl.Ping())
			}
			if err := sendInfo(q, act.Info); err != nil {
				return err
			}
		}
	}
}

// Server listens on o.Port, serves one client until it disconnects and
// returns. ready, if not nil, is called once it listens.
func Server(ctx context.Context, a *rdmacm.Agent, o Options, ready func()) error {
	if err := o.norm(); err != nil {
		return err
	}
	e, err := newEndpoint(a.Device())
	if err != nil {
		return err
	}
	buf, err := e.pd.RegMR(make([]byte, o.Size), verbs.LocalWrite|verbs.RemoteRead|verbs.RemoteWrite)
	if err != nil {
		return err
	}
	ln, err := a.Listen(o.Port, 0)
	if err != nil {
		return err
	}
	defer ln.Close()
	if ready != nil {
		ready()
	}
	conn, err := ln.Accept(ctx, e.params())
	if err != nil {
		return err
	}
	defer conn.Close()
	q := conn.QP()
	srv := cmrping.Server{Buf: buf.Bytes()}
	for {
		wc, err := e.next(ctx, conn)
		if errors.Is(err, errDone) {
			return nil // the client disconnected: rping's normal end
		}
		if err != nil {
			return err
		}
		if wc.Status != verbs.Success {
			if wc.Status == verbs.WRFlushErr {
				return nil
			}
			return fmt.Errorf("rping: %v completion: %v", wc.Opcode, wc.Status)
		}
		var act cmrping.Action
		switch {
		case wc.IsRecv:
			msg := append([]byte(nil), e.recv.Bytes()[:wc.ByteLen]...)
			if err := e.postRecv(q); err != nil {
				return err
			}
			if act, err = srv.OnRecv(msg); err != nil {
				return err
			}
		case wc.Opcode == verbs.WCRDMARead || wc.Opcode == verbs.WCRDMAWrite:
			if wc.Opcode == verbs.WCRDMARead && o.Verbose {
				fmt.Fprintf(o.Out, "server ping data: %s\n", cstring(buf.Bytes()))
			}
			if act, err = srv.OnComplete(); err != nil {
				return err
			}
		default:
			continue // our "go ahead" SENDs
		}
		switch act.Kind {
		case cmrping.ActSendInfo:
			err = sendInfo(q, act.Info)
		case cmrping.ActRDMARead:
			_, err = q.PostSend(verbs.SendWR{ID: 3, Opcode: verbs.RDMARead, Flags: verbs.Signaled,
				SG:         []verbs.SGE{{Addr: buf.IOVA(), Length: act.Remote.Size, LKey: buf.LKey()}},
				RemoteAddr: act.Remote.Buf, RKey: act.Remote.RKey})
		case cmrping.ActRDMAWrite:
			_, err = q.PostSend(verbs.SendWR{ID: 4, Opcode: verbs.RDMAWrite, Flags: verbs.Signaled,
				SG:         []verbs.SGE{{Addr: buf.IOVA(), Length: uint32(act.Len), LKey: buf.LKey()}},
				RemoteAddr: act.Remote.Buf, RKey: act.Remote.RKey})
		}
		if err != nil {
			return err
		}
	}
}
