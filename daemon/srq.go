package daemon

import (
	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/shmring"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// srqObj is a client's shared receive queue: the device's SRQ and the ring
// the client posts its receives into, which the engine fetches into the
// SRQ as it fetches QPs' RQ rings (rings.go, proto/srq.go).
type srqObj struct {
	owner *session
	h     proto.Handle
	srq   *rnic.SRQ
	pd    *pdObj
	ring  *shmring.Ring
	refs  int // QPs using it (guarded by the session's mu)
	// The rest is the engine's: the ring's consumer side, WR decode
	// buffers (reused), a ring corrupted by the client, and a ring whose
	// WRs the device's SRQ had no room for.
	cons    *shmring.Consumer
	wr      [fetchBatch]verbs.RecvWR
	broken  bool
	blocked bool
}

func (ss *session) createSRQ(body []byte) (any, []int, error) {
	var req proto.CreateSRQReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	info := &ss.s.info
	if req.MaxWR == 0 || req.MaxWR > info.MaxSRQWR || req.MaxSGE == 0 || req.MaxSGE > info.MaxSGE {
		return nil, nil, errf(unix.EINVAL, "SRQ of %d WRs, %d SGEs: at most %d, %d", req.MaxWR, req.MaxSGE, info.MaxSRQWR, info.MaxSGE)
	}
	slots := pow2(req.MaxWR)
	ss.mu.Lock()
	p, ok := ss.pds[req.PD]
	ss.mu.Unlock()
	if !ok {
		return nil, nil, errf(unix.ENOENT, "no PD %d on this connection", req.PD)
	}
	ring, err := shmring.Create("softrnic-srq", shmring.Geometry{SlotSize: proto.RecvSlotSize(ib.QPCaps{MaxRecvSGE: req.MaxSGE}), Slots: int(slots)})
	if err != nil {
		return nil, nil, err
	}
	vsrq, err := p.pd.CreateSRQ(int(slots), int(req.MaxSGE))
	if err != nil {
		ring.Close()
		return nil, nil, err
	}
	x := &srqObj{owner: ss, srq: vsrq.(*rnic.SRQ), pd: p, ring: ring, cons: ring.Consumer()}
	// The limit counts what waits in the ring too: a receive the client
	// posted is the SRQ's, whether the engine has fetched it yet or not.
	x.srq.SetBacklog(ring.Pending)
	sg := make([]ib.SGE, fetchBatch*int(req.MaxSGE))
	for i := range fetchBatch {
		x.wr[i].SG, sg = sg[:0:req.MaxSGE], sg[req.MaxSGE:]
	}
	ss.mu.Lock()
	x.h, err = ss.newHandle(true)
	if err == nil {
		ss.srqs[x.h] = x
		ss.liveSRQs++
		p.refs++
	}
	ss.mu.Unlock()
	if err != nil {
		if derr := x.srq.Destroy(); derr != nil {
			ss.log.Warn("undoing CREATE_SRQ", "err", derr)
		}
		ring.Close()
		return nil, nil, err
	}
	ss.s.indexSRQ(x)
	ss.s.ringsMu.Lock()
	ss.s.srqList = append(ss.s.srqList, x)
	ss.s.ringsMu.Unlock()
	ss.s.dev.Wake() // the engine arms the new ring (see createQP)
	return &proto.CreateSRQResp{SRQ: x.h, Slots: slots, MaxWR: slots, MaxSGE: req.MaxSGE}, []int{ring.FD()}, nil
}

func (ss *session) lookupSRQ(h proto.Handle) (*srqObj, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	x, ok := ss.srqs[h]
	if !ok {
		return nil, errf(unix.ENOENT, "no SRQ %d on this connection", h)
	}
	return x, nil
}

func (ss *session) modifySRQ(body []byte) (any, []int, error) {
	var req proto.ModifySRQReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	x, err := ss.lookupSRQ(req.SRQ)
	if err != nil {
		return nil, nil, err
	}
	return nil, nil, x.srq.Modify(&req.Attr, req.Mask)
}

func (ss *session) querySRQ(body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	x, err := ss.lookupSRQ(h)
	if err != nil {
		return nil, nil, err
	}
	a, err := x.srq.Query()
	if err != nil {
		return nil, nil, err
	}
	return &a, nil, nil
}

func (ss *session) destroySRQ(body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	ss.mu.Lock()
	x, ok := ss.srqs[h]
	busy := ok && x.refs > 0
	if ok && !busy {
		delete(ss.srqs, h)
	}
	ss.mu.Unlock()
	if !ok {
		return nil, nil, errf(unix.ENOENT, "no SRQ %d on this connection", h)
	}
	if busy {
		return nil, nil, errf(unix.EBUSY, "SRQ %d is used by %d QPs", h, x.refs)
	}
	return nil, nil, ss.releaseSRQ(x)
}

// releaseSRQ destroys an SRQ no QP uses any more: out of the engine's
// list first, so that its ring is never unmapped under the engine.
func (ss *session) releaseSRQ(x *srqObj) error {
	s := ss.s
	s.unindexSRQ(x)
	s.ringsMu.Lock()
	for i, y := range s.srqList {
		if y == x {
			s.srqList = append(s.srqList[:i], s.srqList[i+1:]...)
			break
		}
	}
	s.ringsMu.Unlock()
	err := x.srq.Destroy()
	x.ring.Close()
	ss.mu.Lock()
	x.pd.refs--
	ss.liveSRQs--
	ss.buryGraves()
	ss.mu.Unlock()
	return err
}

// srqBroken retires an SRQ whose ring cannot be trusted (engine
// goroutine): no QP takes receives from its ring any more (SRQ_ERR).
func (s *Server) srqBroken(x *srqObj, err error) {
	s.BadWQEs.Add(1)
	x.broken = true
	s.log.Warn("client corrupted an SRQ ring; SRQ retired", "client", x.owner.id, "srq", x.h, "err", err)
	s.ownEvent(x.owner, proto.AsyncEventMsg{Type: ib.EventSRQErr, Handle: x.h})
}
