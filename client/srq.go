package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/shmring"
	"github.com/softrnic/softrnic/verbs"
)

// SRQ is a shared receive queue: a ring the daemon drains into its
// device's SRQ, as it drains a QP's RQ ring.
type SRQ struct {
	c      *Client
	h      proto.Handle
	maxSGE int
	ring   *shmring.Ring
	mu     sync.Mutex
	prod   *shmring.Producer
}

var _ verbs.SRQ = (*SRQ)(nil)

// CreateSRQ makes a shared receive queue of at least maxWR receives of at
// most maxSGE entries each (ibv_create_srq); Query says what was granted.
func (p *PD) CreateSRQ(maxWR, maxSGE int) (verbs.SRQ, error) {
	if maxWR <= 0 || maxSGE <= 0 || maxWR > 1<<31-1 || maxSGE > 255 {
		return nil, fmt.Errorf("softrnic: SRQ of %d WRs, %d SGEs: %w", maxWR, maxSGE, verbs.ErrInvalid)
	}
	body, fds, err := p.c.call(proto.OpCreateSRQ, &proto.CreateSRQReq{PD: p.h, MaxWR: uint32(maxWR), MaxSGE: uint32(maxSGE)}, 1)
	if err != nil {
		return nil, err
	}
	var r proto.CreateSRQResp
	if err := proto.DecodeBody(body, &r); err != nil {
		proto.CloseFDs(fds)
		return nil, err
	}
	ring, err := shmring.Map(fds[0], shmring.Geometry{SlotSize: proto.RecvSlotSize(ib.QPCaps{MaxRecvSGE: r.MaxSGE}), Slots: int(r.Slots)})
	if err != nil {
		return nil, errors.Join(err, p.c.callHandle(proto.OpDestroySRQ, r.SRQ))
	}
	x := &SRQ{c: p.c, h: r.SRQ, maxSGE: int(r.MaxSGE), ring: ring, prod: ring.Producer(p.c.db)}
	p.c.objMu.Lock()
	p.c.srqs[x.h] = x
	p.c.objMu.Unlock()
	return x, nil
}

// Handle is the SRQ's handle on this connection.
func (x *SRQ) Handle() proto.Handle { return x.h }

// PostRecv posts receive work requests, publishing them together: no
// syscall unless the daemon sleeps, no allocation.
func (x *SRQ) PostRecv(ws []verbs.RecvWR) (int, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := 0
	var err error
	for i := range ws {
		if len(ws[i].SG) > x.maxSGE {
			err = verbs.ErrTooManySGE
			break
		}
		s := x.prod.Reserve()
		if s == nil {
			err = verbs.ErrQueueFull
			break
		}
		_ = proto.PutRecvWR(s, &ws[i]) // it fits: the slot holds maxSGE entries, checked above
		n++
	}
	if n > 0 {
		if _, cerr := x.prod.Commit(); cerr != nil && err == nil {
			err = cerr
		}
	}
	return n, err
}

// Modify arms the SRQ's limit (ibv_modify_srq; see verbs.SRQ).
func (x *SRQ) Modify(attr *ib.SRQAttr, mask ib.SRQAttrMask) error {
	_, _, err := x.c.call(proto.OpModifySRQ, &proto.ModifySRQReq{SRQ: x.h, Mask: mask, Attr: *attr}, 0)
	return err
}

// Query returns the SRQ's size and armed limit (ibv_query_srq).
func (x *SRQ) Query() (ib.SRQAttr, error) {
	body, _, err := x.c.call(proto.OpQuerySRQ, &proto.HandleMsg{Handle: x.h}, 0)
	var a ib.SRQAttr
	if err == nil {
		err = proto.DecodeBody(body, &a)
	}
	return a, err
}

// Destroy destroys the SRQ; QPs using it must be destroyed first (EBUSY).
func (x *SRQ) Destroy() error {
	if err := x.c.callHandle(proto.OpDestroySRQ, x.h); err != nil {
		return err
	}
	x.c.objMu.Lock()
	delete(x.c.srqs, x.h)
	x.c.objMu.Unlock()
	return x.ring.Close()
}

// SyncRecv implements verbs.RecvSyncer: it returns once the daemon's
// device holds every receive posted to the SRQ so far.
func (x *SRQ) SyncRecv(ctx context.Context) error {
	for {
		x.mu.Lock()
		backlog := x.ring.Geometry().Slots - x.prod.Free()
		x.mu.Unlock()
		if backlog == 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("softrnic: SRQ %d: %d receives not taken by the daemon: %w", x.h, backlog, err)
		}
		time.Sleep(10 * time.Microsecond)
	}
}
