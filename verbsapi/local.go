package verbsapi

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rnic"
)

// Resolver returns the MAC addresses frames to peer go between (ours, the
// next hop's), as perftest/runner.Host.Resolve does.
type Resolver func(ctx context.Context, peer netip.Addr) (src, dst [6]byte, err error)

// resolveTimeout bounds one neighbour resolution of a Modify or CreateAH.
const resolveTimeout = 3 * time.Second

// Local is a rnic.Device in this process as a Device: name is its
// interface, resolve finds the MAC of a peer (RTR of RC/UC QPs, address
// handles), stats (optional) snapshots the device counters from another
// goroutine (engine.Loop.DeviceStats).
func Local(dev *rnic.Device, name string, resolve Resolver, stats func() rnic.Stats) Device {
	return &local{dev: dev, name: name, resolve: resolve, stats: stats}
}

type local struct {
	dev     *rnic.Device
	name    string
	resolve Resolver
	stats   func() rnic.Stats
}

func (d *local) Name() string       { return d.name }
func (d *local) GIDs() []netip.Addr { return slices.Clone(d.dev.Config().Addrs) }
func (d *local) PortMTU() int       { return d.dev.Config().PortMTU }

// Congestion implements Congested.
func (d *local) Congestion() rnic.Congestion { return d.dev.Config().Congestion }

// Stats implements Stater when the device was given a snapshot function.
func (d *local) Stats() rnic.Stats {
	if d.stats == nil {
		return rnic.Stats{}
	}
	return d.stats()
}

// TransportProgress implements ProgressCounter.
func (d *local) TransportProgress(qpns []uint32) uint64 {
	var n uint64
	d.dev.EachQPCounters(func(c *rnic.QPCounters) {
		if slices.Contains(qpns, c.QPN) {
			n += c.RC.Progress
		}
	})
	return n
}

// heapMem is tool memory in process: an ordinary slice.
type heapMem []byte

func (m heapMem) Bytes() []byte { return m }
func (m heapMem) Free() error   { return nil }

func (d *local) AllocMem(n int) (Mem, error) {
	if n <= 0 {
		return nil, fmt.Errorf("rnic: AllocMem of %d bytes", n)
	}
	return heapMem(make([]byte, n)), nil
}

func (d *local) AllocPD() (PD, error) { return &localPD{d: d, pd: d.dev.AllocPD()}, nil }

func (d *local) CreateCQ(depth int) (CQ, error) {
	if depth <= 0 {
		return nil, fmt.Errorf("rnic: CQ depth %d", depth)
	}
	return localCQ{d.dev.CreateCQ(depth)}, nil
}

type localCQ struct{ cq *rnic.CQ }

func (c localCQ) Poll(wcs []ib.WC) int    { return c.cq.Poll(wcs) }
func (c localCQ) Destroy() error          { return nil } // verbs CQs are garbage collected
func (c localCQ) Notify() <-chan struct{} { return c.cq.Notify() }

func (c localCQ) Wait(timeout time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-c.cq.Notify():
	case <-t.C:
	}
}

type localPD struct {
	d  *local
	pd *rnic.PD
}

func (p *localPD) Dealloc() error { return nil }

func (p *localPD) RegMR(m Mem, off, n int, iova uint64, access ib.Access) (MR, error) {
	b := m.Bytes()
	if off < 0 || n <= 0 || off+n > len(b) {
		return nil, fmt.Errorf("rnic: MR [%d, %d) outside the %d-byte memory", off, off+n, len(b))
	}
	var mr *rnic.MR
	var err error
	if iova == 0 {
		mr, err = p.pd.RegMR(b[off:off+n], access)
	} else {
		mr, err = p.pd.RegMRIOVA(b[off:off+n], iova, access)
	}
	if err != nil {
		return nil, err
	}
	return localMR{mr}, nil
}

type localMR struct{ mr *rnic.MR }

func (m localMR) LKey() uint32 { return m.mr.LKey() }
func (m localMR) RKey() uint32 { return m.mr.RKey() }
func (m localMR) IOVA() uint64 { return m.mr.IOVA() }
func (m localMR) Dereg() error { m.mr.Dereg(); return nil }

// destMAC resolves a peer's MAC for a QP or address handle.
func (p *localPD) destMAC(ip netip.Addr) ([6]byte, error) {
	if p.d.resolve == nil {
		return [6]byte{}, fmt.Errorf("rnic: no route to %v: no resolver", ip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	_, dst, err := p.d.resolve(ctx, ip)
	if err != nil {
		return dst, fmt.Errorf("no route to %v: %w", ip, err)
	}
	return dst, nil
}

type localAH struct {
	ah *rnic.AH
	ip netip.Addr
}

func (a *localAH) Dest() netip.Addr { return a.ip }

func (p *localPD) CreateAH(av ib.AddressVector) (AH, error) {
	if av.DMAC == ([6]byte{}) {
		mac, err := p.destMAC(av.DGID.Addr())
		if err != nil {
			return nil, err
		}
		av.DMAC = mac
	}
	ah, err := p.pd.CreateAH(av)
	if err != nil {
		return nil, err
	}
	return &localAH{ah: ah, ip: av.DGID.Addr()}, nil
}

func (p *localPD) CreateQP(a QPInitAttr) (QP, error) {
	scq, ok1 := a.SendCQ.(localCQ)
	rcq, ok2 := a.RecvCQ.(localCQ)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("rnic: CreateQP with CQs of another RNIC")
	}
	q, err := p.pd.CreateQP(rnic.QPInitAttr{Type: a.Type, SendCQ: scq.cq, RecvCQ: rcq.cq, MaxSendWR: a.MaxSendWR,
		MaxRecvWR: a.MaxRecvWR, MaxSGE: a.MaxSGE, MaxInline: a.MaxInline, SigAll: a.SigAll})
	if err != nil {
		return nil, err
	}
	return &localQP{p: p, q: q}, nil
}

// localQP converts each SendWR into its one rnic.SendWR (verbs copies what
// it needs at post time), so a post allocates nothing.
type localQP struct {
	p   *localPD
	q   *rnic.QP
	swr [1]rnic.SendWR
	rwr [1]rnic.RecvWR
}

func (q *localQP) QPN() uint32        { return q.q.QPN() }
func (q *localQP) WithLock(fn func()) { q.q.WithLock(fn) }
func (q *localQP) Destroy() error     { q.q.Destroy(); return nil }

// CongestionState implements CCQP.
func (q *localQP) CongestionState() (dcqcn.State, bool) { return q.q.CongestionState() }

func (q *localQP) Modify(a *ib.QPAttr, mask ib.QPAttrMask) error {
	if mask&ib.AttrAV != 0 && q.p != nil && q.q.Type().Connected() && a.AV.DMAC == ([6]byte{}) && a.AV.DGID.Addr().IsValid() {
		mac, err := q.p.destMAC(a.AV.DGID.Addr())
		if err != nil {
			return err
		}
		a.AV.DMAC = mac
	}
	return q.q.Modify(a, mask)
}

func (q *localQP) PostSend(w *SendWR) error {
	s := &q.swr[0]
	*s = rnic.SendWR{ID: w.ID, Opcode: w.Opcode, Flags: w.Flags, SG: w.SG, InlineData: w.InlineData, Imm: w.Imm,
		RemoteAddr: w.RemoteAddr, RKey: w.RKey, CompareAdd: w.CompareAdd, Swap: w.Swap,
		RemoteQPN: w.RemoteQPN, RemoteQKey: w.RemoteQKey}
	if w.AH != nil {
		ah, ok := w.AH.(*localAH)
		if !ok {
			return fmt.Errorf("rnic: address handle of another RNIC")
		}
		s.AH = ah.ah
	}
	_, err := q.q.PostSend(q.swr[:]...)
	return err
}

func (q *localQP) PostRecv(w *RecvWR) error {
	q.rwr[0] = rnic.RecvWR(*w)
	_, err := q.q.PostRecv(q.rwr[:]...)
	return err
}

// VerbsPD is the verbs PD under a PD of a Local device (nil for another
// RNIC's): for code that hands it to package rdmacm, which creates its QPs
// itself.
func VerbsPD(p PD) *rnic.PD {
	if lp, ok := p.(*localPD); ok {
		return lp.pd
	}
	return nil
}

// VerbsCQ is the verbs CQ under a CQ of a Local device (nil for another
// RNIC's).
func VerbsCQ(c CQ) *rnic.CQ {
	if lc, ok := c.(localCQ); ok {
		return lc.cq
	}
	return nil
}

// LocalQP wraps a verbs QP created in p (a PD of a Local device) by other
// means, such as rdmacm, as a QP.
func LocalQP(p PD, q *rnic.QP) QP {
	lp, _ := p.(*localPD)
	return &localQP{p: lp, q: q}
}
