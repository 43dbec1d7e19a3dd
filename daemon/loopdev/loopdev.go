// Package loopdev is a loopback RNIC that satisfies daemon.Device, for tests
// of the daemon and its clients before and besides the real engine: its QPs
// reach only QPs of the same Device, and work requests execute synchronously
// when posted. It checks every access the way a real RNIC must (lkey and
// rkey, PD, access flags, bounds, QP state), so that tests of isolation
// between clients (a wrong rkey gives a remote access error and writes
// nothing) mean something. It is not the data path; the engine is.
package loopdev

import (
	"crypto/rand"
	"encoding/binary"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
)

// Device is the loopback RNIC.
type Device struct {
	mu    sync.Mutex // one lock for the whole device: a test double, not a data path
	info  proto.DeviceInfo
	qps   map[uint32]*qp
	lkeys map[uint32]*mr
	rkeys map[uint32]*mr
	qpn   uint32

	// Live counts objects not yet destroyed, for leak checks in tests.
	Live struct{ PDs, MRs, CQs, QPs int }
}

var _ daemon.Device = (*Device)(nil)

// New makes a loopback device named name.
func New(name string) *Device {
	d := &Device{qps: map[uint32]*qp{}, lkeys: map[uint32]*mr{}, rkeys: map[uint32]*mr{}, qpn: 0x10}
	copy(d.info.Name[:], name)
	d.info.MaxQP, d.info.MaxCQ, d.info.MaxMR, d.info.MaxPD = 1024, 1024, 4096, 1024
	d.info.MaxQPWR, d.info.MaxCQE, d.info.MaxSGE, d.info.MaxInline = 4096, 65536, 8, 256
	d.info.MaxMRSize, d.info.ActiveMTU, d.info.PortActive = 1<<32, 4096, 1
	d.info.NumGIDs = 1
	copy(d.info.GIDs[0][:], []byte{0: 0, 10: 0xff, 11: 0xff, 12: 127, 13: 0, 14: 0, 15: 1})
	return d
}

// Info implements daemon.Device.
func (d *Device) Info() proto.DeviceInfo { return d.info }

// Counts returns the live object counts under the device lock.
func (d *Device) Counts() (pds, mrs, cqs, qps int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.Live.PDs, d.Live.MRs, d.Live.CQs, d.Live.QPs
}

type pd struct{ d *Device }

// AllocPD implements daemon.Device.
func (d *Device) AllocPD() (daemon.PD, error) {
	d.mu.Lock()
	d.Live.PDs++
	d.mu.Unlock()
	return &pd{d}, nil
}

func (p *pd) Dealloc() error {
	p.d.mu.Lock()
	p.d.Live.PDs--
	p.d.mu.Unlock()
	return nil
}

type mr struct {
	pd         *pd
	mem        []byte
	iova       uint64
	access     ib.Access
	lkey, rkey uint32
	valid      bool
}

// randomKey returns a key not in use: rkeys must not be guessable.
func randomKey(used ...map[uint32]*mr) uint32 {
	var b [4]byte
	for {
		rand.Read(b[:])
		k := binary.LittleEndian.Uint32(b[:])
		free := k != 0
		for _, m := range used {
			if _, ok := m[k]; ok {
				free = false
			}
		}
		if free {
			return k
		}
	}
}

func (p *pd) RegMR(mem []byte, iova uint64, access ib.Access) (daemon.MR, error) {
	d := p.d
	d.mu.Lock()
	defer d.mu.Unlock()
	m := &mr{pd: p, mem: mem, iova: iova, access: access, valid: true}
	m.lkey = randomKey(d.lkeys, d.rkeys)
	d.lkeys[m.lkey] = m
	m.rkey = randomKey(d.lkeys, d.rkeys)
	d.rkeys[m.rkey] = m
	d.Live.MRs++
	return m, nil
}

func (m *mr) LKey() uint32 { return m.lkey }
func (m *mr) RKey() uint32 { return m.rkey }
func (m *mr) Deregister() error {
	d := m.pd.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if m.valid {
		m.valid = false
		delete(d.lkeys, m.lkey)
		delete(d.rkeys, m.rkey)
		d.Live.MRs--
	}
	return nil
}

// span returns the bytes [va, va+n) of m if it grants need and covers them.
func (m *mr) span(va, n uint64, need ib.Access) ([]byte, bool) {
	if m == nil || !m.valid || m.access&need != need || va < m.iova || va-m.iova > uint64(len(m.mem)) || n > uint64(len(m.mem))-(va-m.iova) {
		return nil, false
	}
	off := va - m.iova
	return m.mem[off : off+n], true
}

type cq struct {
	d      *Device
	q      []ib.WC
	depth  int
	notify func()
	lost   int
}

// CreateCQ implements daemon.Device.
func (d *Device) CreateCQ(depth int, notify func()) (daemon.CQ, error) {
	d.mu.Lock()
	d.Live.CQs++
	d.mu.Unlock()
	return &cq{d: d, depth: depth, notify: notify}, nil
}

// push adds a completion; caller holds d.mu.
func (c *cq) push(w ib.WC) {
	if len(c.q) >= c.depth {
		c.lost++ // CQ overrun: a real device raises an async error
		return
	}
	c.q = append(c.q, w)
	if c.notify != nil {
		c.notify()
	}
}

func (c *cq) Poll(wcs []ib.WC) int {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	n := copy(wcs, c.q)
	c.q = c.q[:copy(c.q, c.q[n:])]
	return n
}

func (c *cq) Destroy() error {
	c.d.mu.Lock()
	c.d.Live.CQs--
	c.d.mu.Unlock()
	return nil
}

type recvEntry struct {
	id uint64
	sg []proto.SGE
}

type qp struct {
	d               *Device
	pd              *pd
	qpn             uint32
	typ             proto.QPType
	scq, rcq        *cq
	sigAll          bool
	attr            proto.QPAttr
	rq              []recvEntry
	gather, scatter [][]byte
}

func (p *pd) CreateQP(typ proto.QPType, caps proto.QPCaps, sendCQ, recvCQ daemon.CQ, sigAll bool) (daemon.QP, error) {
	d := p.d
	d.mu.Lock()
	defer d.mu.Unlock()
	d.qpn++
	q := &qp{d: d, pd: p, qpn: d.qpn, typ: typ, scq: sendCQ.(*cq), rcq: recvCQ.(*cq), sigAll: sigAll}
	d.qps[q.qpn] = q
	d.Live.QPs++
	return q, nil
}

func (q *qp) QPN() uint32 { return q.qpn }

func (q *qp) Query() (proto.QPAttr, error) {
	q.d.mu.Lock()
	defer q.d.mu.Unlock()
	return q.attr, nil
}

// Modify follows the IBA state diagram for the transitions RoCE uses.
func (q *qp) Modify(a *proto.QPAttr, mask proto.QPAttrMask) error {
	q.d.mu.Lock()
	defer q.d.mu.Unlock()
	cur, next := q.attr.State, q.attr.State
	if mask&proto.AttrState != 0 {
		next = a.State
	}
	ok := next == proto.Err || next == proto.Reset || next == cur ||
		(cur == proto.Reset && next == proto.Init) || (cur == proto.Init && next == proto.RTR) ||
		(cur == proto.RTR && next == proto.RTS)
	if !ok {
		return unix.EINVAL
	}
	if next == proto.RTR && cur == proto.Init && q.typ == proto.RC && mask&proto.AttrDestQPN == 0 && q.attr.DestQPN == 0 {
		return unix.EINVAL
	}
	if mask&proto.AttrAccessFlags != 0 {
		q.attr.Access = a.Access
	}
	if mask&proto.AttrDestQPN != 0 {
		q.attr.DestQPN = a.DestQPN
	}
	if mask&proto.AttrQKey != 0 {
		q.attr.QKey = a.QKey
	}
	if mask&proto.AttrRQPSN != 0 {
		q.attr.RQPSN = a.RQPSN
	}
	if mask&proto.AttrSQPSN != 0 {
		q.attr.SQPSN = a.SQPSN
	}
	if mask&proto.AttrPathMTU != 0 {
		q.attr.PathMTU = a.PathMTU
	}
	if mask&proto.AttrAV != 0 {
		q.attr.DGID = a.DGID
	}
	q.attr.State = next
	if next == proto.Err {
		q.flushRQ()
	}
	if next == proto.Reset {
		q.rq = q.rq[:0]
	}
	return nil
}

// flushRQ completes every posted receive with WR_FLUSH_ERR; caller holds d.mu.
func (q *qp) flushRQ() {
	for _, e := range q.rq {
		q.rcq.push(ib.WC{ID: e.id, Status: ib.WRFlushErr, Opcode: ib.WCRecv, QPN: q.qpn, IsRecv: true})
	}
	q.rq = q.rq[:0]
}

func (q *qp) Destroy() error {
	d := q.d
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.qps, q.qpn)
	d.Live.QPs--
	return nil
}

func (q *qp) PostRecv(w *proto.RecvWR) error {
	q.d.mu.Lock()
	defer q.d.mu.Unlock()
	if q.attr.State == proto.Reset {
		return unix.EINVAL
	}
	e := recvEntry{id: w.ID, sg: append([]proto.SGE(nil), w.SG...)}
	if q.attr.State == proto.Err {
		q.rcq.push(ib.WC{ID: w.ID, Status: ib.WRFlushErr, Opcode: ib.WCRecv, QPN: q.qpn, IsRecv: true})
		return nil
	}
	q.rq = append(q.rq, e)
	return nil
}

// resolve turns SGEs into memory of this QP's PD; need is LocalWrite for
// buffers the device writes.
func (q *qp) resolve(dst [][]byte, sg []proto.SGE, need ib.Access) ([][]byte, uint64, bool) {
	dst = dst[:0]
	var total uint64
	for _, e := range sg {
		m := q.d.lkeys[e.LKey]
		if m == nil || m.pd != q.pd {
			return dst, 0, false
		}
		b, ok := m.span(e.Addr, uint64(e.Length), need)
		if !ok {
			return dst, 0, false
		}
		dst = append(dst, b)
		total += uint64(e.Length)
	}
	return dst, total, true
}

var wcOp = [...]ib.WCOpcode{ib.Send: ib.WCSend, ib.SendWithImm: ib.WCSend, ib.SendWithInv: ib.WCSend,
	ib.RDMAWrite: ib.WCRDMAWrite, ib.RDMAWriteWithImm: ib.WCRDMAWrite, ib.RDMARead: ib.WCRDMARead,
	ib.AtomicCmpAndSwp: ib.WCCompSwap, ib.AtomicFetchAndAdd: ib.WCFetchAdd}

func (q *qp) PostSend(w *proto.SendWR) error {
	d := q.d
	d.mu.Lock()
	defer d.mu.Unlock()
	switch q.attr.State {
	case proto.Reset, proto.Init, proto.RTR:
		return unix.EINVAL
	case proto.Err:
		q.scq.push(ib.WC{ID: w.ID, Status: ib.WRFlushErr, Opcode: wcOp[w.Opcode], QPN: q.qpn})
		return nil
	}
	st, n := q.execute(w)
	if st != ib.Success {
		q.attr.State = proto.Err
		q.flushRQ()
	}
	if st != ib.Success || q.sigAll || w.Flags&ib.Signaled != 0 {
		q.scq.push(ib.WC{ID: w.ID, Status: st, Opcode: wcOp[w.Opcode], ByteLen: n, QPN: q.qpn})
	}
	return nil
}

// execute runs one WR against the peer QP; caller holds d.mu.
func (q *qp) execute(w *proto.SendWR) (ib.WCStatus, uint32) {
	need := ib.Access(0)
	if w.Opcode.IsReadOrAtomic() {
		need = ib.LocalWrite
	}
	var local [][]byte
	var n uint64
	if w.Flags&ib.Inline != 0 {
		if w.Opcode.IsReadOrAtomic() {
			return ib.LocQPOpErr, 0
		}
		local, n = append(q.gather[:0], w.Inline), uint64(len(w.Inline))
	} else {
		var ok bool
		local, n, ok = q.resolve(q.gather, w.SG, need)
		if !ok {
			return ib.LocProtErr, 0
		}
	}
	q.gather = local
	dest := q.attr.DestQPN
	if q.typ == proto.UD {
		dest = w.RemoteQPN
	}
	peer := q.d.qps[dest]
	if peer == nil || (peer.attr.State != proto.RTR && peer.attr.State != proto.RTS) || peer.typ != q.typ {
		return ib.RetryExcErr, 0 // nobody answers: the requester's retries run out
	}
	if q.typ == proto.UD && (w.Opcode != ib.Send && w.Opcode != ib.SendWithImm || w.QKey != peer.attr.QKey) {
		return ib.Success, uint32(n) // UD drops silently at the receiver
	}
	switch {
	case w.Opcode.IsSend():
		return peer.deliver(q, w, local, n)
	case w.Opcode.IsWrite():
		remote, ok := peer.remote(w.RKey, w.RemoteAddr, n, ib.RemoteWrite)
		if !ok {
			return ib.RemAccessErr, 0
		}
		gatherInto(remote, local)
		if w.Opcode == ib.RDMAWriteWithImm {
			if len(peer.rq) == 0 {
				return ib.RNRRetryExcErr, 0
			}
			e := peer.rq[0]
			peer.rq = peer.rq[1:]
			peer.rcq.push(ib.WC{ID: e.id, Opcode: ib.WCRecvRDMAWithImm, Flags: ib.WCWithImm, Imm: w.Imm, ByteLen: uint32(n), QPN: peer.qpn, IsRecv: true})
		}
		return ib.Success, uint32(n)
	case w.Opcode == ib.RDMARead:
		remote, ok := peer.remote(w.RKey, w.RemoteAddr, n, ib.RemoteRead)
		if !ok {
			return ib.RemAccessErr, 0
		}
		scatterFrom(local, remote)
		return ib.Success, uint32(n)
	default: // atomics
		if n != 8 {
			return ib.LocLenErr, 0
		}
		if w.RemoteAddr%8 != 0 {
			return ib.RemInvReqErr, 0
		}
		remote, ok := peer.remote(w.RKey, w.RemoteAddr, 8, ib.RemoteAtomic)
		if !ok {
			return ib.RemAccessErr, 0
		}
		var old uint64
		if w.Opcode == ib.AtomicCmpAndSwp {
			old = ib.LocalSeg(remote).CmpSwap(w.Compare, w.SwapAdd)
		} else {
			old = ib.LocalSeg(remote).FetchAdd(w.SwapAdd)
		}
		var b [8]byte
		binary.NativeEndian.PutUint64(b[:], old)
		scatterFrom(local, b[:])
		return ib.Success, 8
	}
}

// remote resolves an rkey for a peer's access: the MR must be in this QP's
// PD and the QP must allow the access.
func (q *qp) remote(rkey uint32, va, n uint64, need ib.Access) ([]byte, bool) {
	if q.attr.Access&need != need {
		return nil, false
	}
	m := q.d.rkeys[rkey]
	if m == nil || m.pd != q.pd {
		return nil, false
	}
	return m.span(va, n, need)
}

func (q *qp) deliver(from *qp, w *proto.SendWR, local [][]byte, n uint64) (ib.WCStatus, uint32) {
	if len(q.rq) == 0 {
		return ib.RNRRetryExcErr, 0
	}
	e := q.rq[0]
	q.rq = q.rq[1:]
	dst, room, ok := q.resolve(q.scatter, e.sg, ib.LocalWrite)
	q.scatter = dst
	wc := ib.WC{ID: e.id, Opcode: ib.WCRecv, ByteLen: uint32(n), QPN: q.qpn, SrcQP: from.qpn, IsRecv: true}
	if !ok || room < n {
		wc.Status = ib.LocLenErr
		if !ok {
			wc.Status = ib.LocProtErr
		}
		q.rcq.push(wc)
		q.attr.State = proto.Err
		q.flushRQ()
		return ib.RemOpErr, 0
	}
	gatherTo(dst, local)
	if w.Opcode == ib.SendWithImm {
		wc.Flags, wc.Imm = ib.WCWithImm, w.Imm
	}
	q.rcq.push(wc)
	return ib.Success, uint32(n)
}

// gatherInto copies the concatenation of src into dst.
func gatherInto(dst []byte, src [][]byte) {
	o := 0
	for _, s := range src {
		o += copy(dst[o:], s)
	}
}

// scatterFrom copies src across the buffers of dst.
func scatterFrom(dst [][]byte, src []byte) {
	for _, d := range dst {
		src = src[copy(d, src):]
	}
}

// gatherTo copies the concatenation of src across the buffers of dst.
func gatherTo(dst, src [][]byte) {
	di, do := 0, 0
	for _, s := range src {
		for len(s) > 0 && di < len(dst) {
			c := copy(dst[di][do:], s)
			s, do = s[c:], do+c
			if do == len(dst[di]) {
				di, do = di+1, 0
			}
		}
	}
}
