package daemon

import (
	"errors"
	"net/netip"
	"sync"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rnic"
)

// VerbsDevice serves a rnic.Device (the real device model, driven by an
// engine goroutine on a port) to daemon clients: it is the small adapter
// between the daemon's Device interface and package verbs.
type VerbsDevice struct {
	dev  *rnic.Device
	name string
	// resolveMAC finds the Ethernet address of a peer's IP address (the
	// neighbour table), for RC/UC connections and UD address handles.
	resolveMAC func(netip.Addr) ([6]byte, error)
	cmAgent    verbsCM // rdma_cm for clients (verbscm.go)
}

var _ Device = (*VerbsDevice)(nil)

// NewVerbsDevice wraps dev, named name (the interface), with resolveMAC to
// turn a destination GID into a MAC address.
func NewVerbsDevice(dev *rnic.Device, name string, resolveMAC func(netip.Addr) ([6]byte, error)) *VerbsDevice {
	return &VerbsDevice{dev: dev, name: name, resolveMAC: resolveMAC}
}

// Info implements Device.
func (v *VerbsDevice) Info() proto.DeviceInfo {
	cfg := v.dev.Config()
	var in proto.DeviceInfo
	copy(in.Name[:], v.name)
	mac := cfg.MAC
	// EUI-64 from the MAC, as rxe derives its node GUID.
	in.NodeGUID = uint64(mac[0]^2)<<56 | uint64(mac[1])<<48 | uint64(mac[2])<<40 | 0xff<<32 | 0xfe<<24 |
		uint64(mac[3])<<16 | uint64(mac[4])<<8 | uint64(mac[5])
	in.MaxQP, in.MaxCQ, in.MaxMR, in.MaxPD = 1<<16, 1<<16, 1<<20, 1<<16
	in.MaxQPWR, in.MaxCQE, in.MaxSGE, in.MaxInline = rnic.MaxQPWR, 1<<20, rnic.MaxSGE, rnic.MaxInline
	in.MaxMRSize, in.ActiveMTU, in.PortActive = rnic.MaxMsgSize, uint32(cfg.PortMTU), 1
	for i, a := range cfg.Addrs {
		if i == len(in.GIDs) {
			break
		}
		in.GIDs[i] = a.As16()
		in.NumGIDs++
	}
	return in
}

// Poll implements Poller: the engine's step in the pump's goroutine.
func (v *VerbsDevice) Poll() bool { return v.dev.Poll() }

// AllocPD implements Device.
func (v *VerbsDevice) AllocPD() (PD, error) { return &verbsPD{v: v, pd: v.dev.AllocPD()}, nil }

type verbsPD struct {
	v  *VerbsDevice
	pd *rnic.PD
}

func (p *verbsPD) Dealloc() error { return nil }

func (p *verbsPD) RegMR(mem []byte, iova uint64, access ib.Access) (MR, error) {
	m, err := p.pd.RegMRIOVA(mem, iova, access)
	if err != nil {
		return nil, err
	}
	return verbsMR{m}, nil
}

type verbsMR struct{ m *rnic.MR }

func (m verbsMR) LKey() uint32      { return m.m.LKey() }
func (m verbsMR) RKey() uint32      { return m.m.RKey() }
func (m verbsMR) Deregister() error { m.m.Dereg(); return nil }

// CreateCQ implements Device. verbs signals new completions on a channel;
// one goroutine per CQ turns that into the pump's notify call (it blocks on
// the channel, so an idle CQ costs nothing). Destroy waits for it to end,
// so notify is never called after the CQ is gone.
func (v *VerbsDevice) CreateCQ(depth int, notify func()) (CQ, error) {
	c := &verbsCQ{cq: v.dev.CreateCQ(depth), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			select {
			case <-c.cq.Notify():
				notify()
			case <-c.stop:
				return
			}
		}
	}()
	return c, nil
}

type verbsCQ struct {
	cq   *rnic.CQ
	stop chan struct{}
	done chan struct{}
}

func (c *verbsCQ) Poll(wcs []ib.WC) int { return c.cq.Poll(wcs) }

func (c *verbsCQ) Destroy() error {
	close(c.stop)
	<-c.done
	return nil
}

func (p *verbsPD) CreateQP(typ proto.QPType, caps proto.QPCaps, sendCQ, recvCQ CQ, sigAll bool) (QP, error) {
	t := ib.RC
	switch typ {
	case proto.RC:
	case proto.UC:
		t = ib.UC
	case proto.UD:
		t = ib.UD
	default:
		return nil, rnic.ErrInvalid
	}
	sge := max(caps.MaxSendSGE, caps.MaxRecvSGE)
	q, err := p.pd.CreateQP(rnic.QPInitAttr{Type: t, SendCQ: sendCQ.(*verbsCQ).cq, RecvCQ: recvCQ.(*verbsCQ).cq,
		MaxSendWR: int(caps.MaxSendWR), MaxRecvWR: int(caps.MaxRecvWR), MaxSGE: int(sge), MaxInline: int(caps.MaxInline), SigAll: sigAll})
	if err != nil {
		return nil, err
	}
	return &verbsQP{p: p, q: q, sg: make([]ib.SGE, 0, sge), ahs: map[[16]byte]ahResult{}, resolving: map[[16]byte]bool{}}, nil
}

// verbsQP adapts one verbs QP. PostSend and PostRecv run on the pump
// goroutine only, so their scratch needs no lock.
type verbsQP struct {
	p *verbsPD
	q *rnic.QP

	swr [1]rnic.SendWR
	rwr [1]rnic.RecvWR
	sg  []ib.SGE

	// UD address handles by destination GID. Resolving a new destination
	// (the neighbour table, perhaps ARP) must not stall the pump, which
	// serves every client: it runs in its own goroutine while the WR waits
	// in the client's ring (ErrQueueFull), and its result lands in ahs.
	ahMu      sync.Mutex
	ahs       map[[16]byte]ahResult
	resolving map[[16]byte]bool
}

type ahResult struct {
	ah  *rnic.AH
	err error
}

func (q *verbsQP) QPN() uint32 { return q.q.QPN() }

func (q *verbsQP) Modify(a *proto.QPAttr, mask proto.QPAttrMask) error {
	va := ib.QPAttr{State: ib.QPState(a.State), Access: a.Access, QKey: a.QKey, PathMTU: a.PathMTU, DestQPN: a.DestQPN,
		RQPSN: a.RQPSN, MaxDestRdAtomic: a.MaxDestRdAtomic, MinRNRTimer: a.MinRNRTimer, SQPSN: a.SQPSN, Timeout: a.Timeout,
		RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry, MaxRdAtomic: a.MaxRdAtomic, PKeyIndex: a.PKeyIndex, Port: 1,
		AV: ib.AddressVector{DGID: a.DGID, SGIDIndex: a.SGIDIndex, TrafficClass: a.TrafficClass, HopLimit: a.HopLimit,
			FlowLabel: a.FlowLabel}}
	if mask&proto.AttrAV != 0 && q.q.Type().Connected() {
		mac, err := q.p.v.resolveMAC(va.AV.DGID.Addr())
		if err != nil {
			return err
		}
		va.AV.DMAC = mac
	}
	return q.q.Modify(&va, ib.QPAttrMask(mask))
}

func (q *verbsQP) Query() (proto.QPAttr, error) {
	a := q.q.Query()
	return proto.QPAttr{State: proto.QPState(a.State), Timeout: a.Timeout, RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry,
		MinRNRTimer: a.MinRNRTimer, MaxRdAtomic: a.MaxRdAtomic, MaxDestRdAtomic: a.MaxDestRdAtomic,
		SGIDIndex: a.AV.SGIDIndex, PathMTU: a.PathMTU, QKey: a.QKey, RQPSN: a.RQPSN, SQPSN: a.SQPSN,
		DestQPN: a.DestQPN, Access: a.Access, PKeyIndex: a.PKeyIndex, HopLimit: a.AV.HopLimit,
		TrafficClass: a.AV.TrafficClass, FlowLabel: a.AV.FlowLabel, DGID: a.AV.DGID}, nil
}

func (q *verbsQP) convertSG(sg []proto.SGE) []ib.SGE {
	out := q.sg[:0]
	for _, e := range sg {
		out = append(out, ib.SGE{Addr: e.Addr, Length: e.Length, LKey: e.LKey})
	}
	q.sg = out
	return out
}

func (q *verbsQP) PostSend(w *proto.SendWR) error {
	s := &q.swr[0]
	*s = rnic.SendWR{ID: w.ID, Opcode: w.Opcode, Flags: w.Flags, InlineData: w.Inline, Imm: w.Imm, InvRKey: w.InvRKey,
		RemoteAddr: w.RemoteAddr, RKey: w.RKey, RemoteQPN: w.RemoteQPN, RemoteQKey: w.QKey}
	if w.Flags&ib.Inline == 0 {
		s.SG = q.convertSG(w.SG)
	}
	switch w.Opcode {
	case ib.AtomicCmpAndSwp:
		s.CompareAdd, s.Swap = w.Compare, w.SwapAdd
	case ib.AtomicFetchAndAdd:
		s.CompareAdd = w.SwapAdd
	}
	if q.q.Type() == ib.UD {
		ah, err := q.ah(w.DGID)
		if err != nil {
			return err
		}
		s.AH = ah
	}
	_, err := q.q.PostSend(q.swr[:]...)
	if errors.Is(err, rnic.ErrQueueFull) {
		return ErrQueueFull
	}
	return err
}

// ah returns the address handle for a UD destination. The first WR to a
// new destination starts its resolution and gets ErrQueueFull, so it stays
// in the ring and is offered again; a destination that does not resolve
// fails its WRs (and is retried after the failure is forgotten).
func (q *verbsQP) ah(gid [16]byte) (*rnic.AH, error) {
	q.ahMu.Lock()
	defer q.ahMu.Unlock()
	if r, ok := q.ahs[gid]; ok {
		if r.err != nil {
			delete(q.ahs, gid) // report once, resolve afresh next time
		}
		return r.ah, r.err
	}
	if !q.resolving[gid] {
		if len(q.ahs) >= 4096 {
			clear(q.ahs) // bound what a client can make the daemon hold
		}
		q.resolving[gid] = true
		go q.resolveAH(gid)
	}
	return nil, ErrQueueFull
}

func (q *verbsQP) resolveAH(gid [16]byte) {
	dst := netip.AddrFrom16(gid).Unmap()
	var r ahResult
	mac, err := q.p.v.resolveMAC(dst)
	if err == nil {
		var sgid uint8 // a UD QP's sends leave from the first GID of the destination's family
		for i, a := range q.p.v.dev.Config().Addrs {
			if a.Is4() == dst.Is4() {
				sgid = uint8(i)
				break
			}
		}
		r.ah, r.err = q.p.pd.CreateAH(ib.AddressVector{DMAC: mac, DGID: ib.GIDFrom(dst), SGIDIndex: sgid})
	} else {
		r.err = err
	}
	q.ahMu.Lock()
	q.ahs[gid] = r
	delete(q.resolving, gid)
	q.ahMu.Unlock()
}

func (q *verbsQP) PostRecv(w *proto.RecvWR) error {
	q.rwr[0] = rnic.RecvWR{ID: w.ID, SG: q.convertSG(w.SG)}
	_, err := q.q.PostRecv(q.rwr[:]...)
	if errors.Is(err, rnic.ErrQueueFull) {
		return ErrQueueFull
	}
	return err
}

func (q *verbsQP) Destroy() error {
	q.q.Destroy()
	return nil
}
