package verbsapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
)

// Daemon is the device of a running softrnic daemon, through the client
// connection c, as a Device. The caller keeps c and closes it when done
// (which frees, in the daemon, everything made through it).
func Daemon(c *client.Client) Device {
	info := c.Info()
	d := &daemonDev{c: c, name: string(bytes.TrimRight(info.Name[:], "\x00")), mtu: int(info.ActiveMTU)}
	for i := 0; i < int(info.NumGIDs) && i < len(info.GIDs); i++ {
		d.gids = append(d.gids, netip.AddrFrom16(info.GIDs[i]).Unmap())
	}
	return d
}

type daemonDev struct {
	c    *client.Client
	name string
	gids []netip.Addr
	mtu  int
}

func (d *daemonDev) Name() string       { return d.name }
func (d *daemonDev) GIDs() []netip.Addr { return append([]netip.Addr(nil), d.gids...) }
func (d *daemonDev) PortMTU() int       { return d.mtu }

func (d *daemonDev) AllocMem(n int) (Mem, error) { return client.AllocMem(n) }

func (d *daemonDev) AllocPD() (PD, error) {
	pd, err := d.c.AllocPD()
	if err != nil {
		return nil, err
	}
	return &daemonPD{d: d, pd: pd}, nil
}

func (d *daemonDev) CreateCQ(depth int) (CQ, error) {
	cq, err := d.c.CreateCQ(depth)
	if err != nil {
		return nil, err
	}
	return daemonCQ{cq}, nil
}

type daemonCQ struct{ cq *client.CQ }

func (c daemonCQ) Poll(wcs []ib.WC) int { return c.cq.Poll(wcs) }
func (c daemonCQ) Destroy() error       { return c.cq.Destroy() }

func (c daemonCQ) Wait(timeout time.Duration) { c.cq.Wait(timeout) }

type daemonPD struct {
	d  *daemonDev
	pd *client.PD
}

func (p *daemonPD) Dealloc() error { return p.pd.Dealloc() }

func (p *daemonPD) RegMR(m Mem, off, n int, iova uint64, access ib.Access) (MR, error) {
	cm, ok := m.(*client.Mem)
	if !ok {
		return nil, errors.New("rnic: the daemon registers only memory from its AllocMem")
	}
	if iova == 0 {
		iova = cm.Addr(off)
	}
	mr, err := p.pd.RegMRIOVA(cm, off, n, iova, access)
	if err != nil {
		return nil, err
	}
	return daemonMR{mr}, nil
}

type daemonMR struct{ mr *client.MR }

func (m daemonMR) LKey() uint32 { return m.mr.LKey }
func (m daemonMR) RKey() uint32 { return m.mr.RKey }
func (m daemonMR) IOVA() uint64 { return m.mr.Addr }
func (m daemonMR) Dereg() error { return m.mr.Dereg() }

// daemonAH is a UD destination: the daemon resolves and caches the address
// handle itself from the destination GID in each WR.
type daemonAH struct {
	ip  netip.Addr
	gid [16]byte
}

func (a *daemonAH) Dest() netip.Addr { return a.ip }

func (p *daemonPD) CreateAH(av ib.AddressVector) (AH, error) {
	if !av.DGID.Addr().IsValid() {
		return nil, fmt.Errorf("rnic: address handle without a destination")
	}
	return &daemonAH{ip: av.DGID.Addr(), gid: av.DGID.Addr().As16()}, nil
}

var protoType = map[ib.QPType]proto.QPType{ib.RC: proto.RC, ib.UC: proto.UC, ib.UD: proto.UD}

func (p *daemonPD) CreateQP(a QPInitAttr) (QP, error) {
	scq, ok1 := a.SendCQ.(daemonCQ)
	rcq, ok2 := a.RecvCQ.(daemonCQ)
	if !ok1 || !ok2 {
		return nil, errors.New("rnic: CreateQP with CQs of another RNIC")
	}
	typ, ok := protoType[a.Type]
	if !ok {
		return nil, fmt.Errorf("rnic: QP type %v through the daemon: %w", a.Type, ErrNotSupported)
	}
	sge := max(a.MaxSGE, 1)
	q, err := p.pd.CreateQP(client.QPInitAttr{Type: typ, SendCQ: scq.cq, RecvCQ: rcq.cq, SigAll: a.SigAll,
		Caps: proto.QPCaps{MaxSendWR: uint32(max(a.MaxSendWR, 1)), MaxRecvWR: uint32(max(a.MaxRecvWR, 1)),
			MaxSendSGE: uint32(sge), MaxRecvSGE: uint32(sge), MaxInline: uint32(max(a.MaxInline, 0))}})
	if err != nil {
		return nil, err
	}
	return newDaemonQP(q, a.Type == ib.UD, sge), nil
}

// newDaemonQP wraps a client QP whose WRs take up to sge SGEs.
func newDaemonQP(q *client.QP, ud bool, sge int) *daemonQP {
	dq := &daemonQP{q: q, ud: ud}
	dq.swr.SG = make([]proto.SGE, 0, sge)
	dq.rwr.SG = make([]proto.SGE, 0, sge)
	return dq
}

// daemonQP converts each WR into its one proto WR, whose SGE slices have
// room for the QP's SGE cap, so a post allocates nothing. smu and rmu keep
// the scratch whole if two goroutines post on one QP.
type daemonQP struct {
	q        *client.QP
	ud       bool
	smu, rmu sync.Mutex
	swr      proto.SendWR
	rwr      proto.RecvWR
}

func (q *daemonQP) QPN() uint32 { return q.q.QPN }

// WithLock just runs fn: the daemon writes the memory from another process,
// and the completion rings order what the tools wait for.
func (q *daemonQP) WithLock(fn func()) { fn() }

func (q *daemonQP) Destroy() error { return q.q.Destroy() }

// Modify sends the attributes and their mask to the daemon
// (ibv_modify_qp): the daemon's device checks them.
func (q *daemonQP) Modify(a *ib.QPAttr, mask ib.QPAttrMask) error {
	pa := proto.QPAttr{State: proto.QPState(a.State), Timeout: a.Timeout, RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry,
		MinRNRTimer: a.MinRNRTimer, MaxRdAtomic: a.MaxRdAtomic, MaxDestRdAtomic: a.MaxDestRdAtomic,
		SGIDIndex: a.AV.SGIDIndex, PathMTU: a.PathMTU, QKey: a.QKey, RQPSN: a.RQPSN, SQPSN: a.SQPSN,
		DestQPN: a.DestQPN, Access: a.Access, PKeyIndex: a.PKeyIndex, HopLimit: a.AV.HopLimit,
		TrafficClass: a.AV.TrafficClass, FlowLabel: a.AV.FlowLabel, DGID: a.AV.DGID}
	return q.q.Modify(&pa, proto.QPAttrMask(mask))
}

func (q *daemonQP) PostSend(w *SendWR) error {
	q.smu.Lock()
	defer q.smu.Unlock()
	s := &q.swr
	sg := s.SG[:0]
	*s = proto.SendWR{ID: w.ID, Opcode: w.Opcode, Flags: w.Flags, Inline: w.InlineData, Imm: w.Imm,
		RemoteAddr: w.RemoteAddr, RKey: w.RKey, RemoteQPN: w.RemoteQPN, QKey: w.RemoteQKey}
	for _, e := range w.SG {
		sg = append(sg, proto.SGE{Addr: e.Addr, Length: e.Length, LKey: e.LKey})
	}
	s.SG = sg
	switch w.Opcode {
	case ib.AtomicCmpAndSwp:
		s.Compare, s.SwapAdd = w.CompareAdd, w.Swap
	case ib.AtomicFetchAndAdd:
		s.SwapAdd = w.CompareAdd
	}
	if w.AH != nil {
		ah, ok := w.AH.(*daemonAH)
		if !ok {
			return errors.New("rnic: address handle of another RNIC")
		}
		s.DGID = ah.gid
	}
	_, err := q.q.PostSend(s)
	return convertErr(err)
}

func (q *daemonQP) PostRecv(w *RecvWR) error {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	r := &q.rwr
	r.ID, r.SG = w.ID, r.SG[:0]
	for _, e := range w.SG {
		r.SG = append(r.SG, proto.SGE{Addr: e.Addr, Length: e.Length, LKey: e.LKey})
	}
	_, err := q.q.PostRecv(r)
	return convertErr(err)
}

// SyncRecv implements RecvSyncer: it waits, yielding the CPU, until the
// daemon's device holds every receive posted so far.
func (q *daemonQP) SyncRecv(ctx context.Context) error {
	for q.q.RecvBacklog() > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("rnic: QP %#x: %d receives not taken by the daemon: %w", q.q.QPN, q.q.RecvBacklog(), err)
		}
		time.Sleep(10 * time.Microsecond)
	}
	return nil
}

// convertErr maps the client's full-queue error to ErrQueueFull.
func convertErr(err error) error {
	if errors.Is(err, client.ErrQueueFull) {
		return ErrQueueFull
	}
	return err
}
