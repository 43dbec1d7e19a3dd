// Package runner runs perftest's eight test programs on softrnic: it is the
// device side (perftest.Local) of `softrnic perf`, creating RC/UC QPs and a
// memory region, connecting them through an engine.Engine to the QPs the
// peer announced over the side channel, and running perftest's loops —
// bandwidth with a TX depth and CQ moderation, ping-pong latency — with an
// optional check of every byte received (--verify).
//
// It drives the transports (transport/rc) through the engine directly, with
// its own minimal memory and receive queue, because the verbs device model
// is not in the tree yet; it should move onto verbs.Device when that lands.
package runner

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/perftest"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/verbs/wr"
)

// Host is what the runner needs from the machine it runs on.
type Host struct {
	Engine *engine.Engine // running (Run) in its own goroutine
	Iface  engine.Interface
	// Resolve returns the MAC addresses frames to peer go between
	// (ours, the next hop's).
	Resolve func(ctx context.Context, peer netip.Addr) (src, dst [6]byte, err error)
	// NextQPN hands out QP numbers unique on the engine.
	NextQPN func() uint32
}

// QPNAllocator returns a NextQPN that counts from 0x11, as rxe numbers QPs.
func QPNAllocator() func() uint32 {
	var n atomic.Uint32
	n.Store(0x10)
	return func() uint32 { return n.Add(1) & bth.QPNMask }
}

// Result is what a run measured.
type Result struct {
	BW     []perftest.BWReport // bandwidth rows (a passive server: the peer's)
	Lat    []perftest.LatReport
	MTU    int
	Verify bool // --verify checked every byte (false: not asked)
}

// Test is one run of a perftest program.
type Test struct {
	h      Host
	p      perftest.Params
	client bool
	out    io.Writer
	quiet  bool

	headerDone bool
	allowed    wr.Access // what the peer may do to our MR

	neg    perftest.Negotiated
	gid    netip.Addr
	region int    // bytes of the MR per QP
	buf    []byte // the MR: region bytes per QP
	iova   uint64
	rkey   uint32
	qps    []*qp
	remote []perftest.Dest
	res    Result
	ctx    context.Context
}

// qp is one QP and the state the application side keeps for it.
type qp struct {
	mu   sync.Mutex // shared with the engine: serialises calls on rc
	rc   *rc.QP
	qpn  uint32
	psn  uint32
	idx  int
	rq   recvQueue
	src  []byte // local source/sink area: the QP's region of the MR
	seen []wr.WC

	wqe wr.SendWQE // reused by every post (rc.QP.Post copies it)
	sg  [1][]byte

	recvBuf   []byte // receive slots (local memory, not remotely accessible)
	recvSlots int
	recvInc   uint64
}

// New prepares a test; Exec runs it.
func New(h Host, p perftest.Params, client bool, out io.Writer) *Test {
	return &Test{h: h, p: p, client: client, out: out, quiet: p.JSON}
}

// Exec runs the test over the side channel conn, returns what it measured
// and always detaches its QPs.
func (t *Test) Exec(ctx context.Context, conn io.ReadWriter) (Result, error) {
	t.ctx = ctx
	defer t.close()
	if t.p.Transport == perftest.UD {
		return t.res, errors.New("perf: UD tests need transport/ud, not yet in this build")
	}
	gid, err := t.h.Iface.GID(t.p.GIDIndex)
	if err != nil {
		return t.res, err
	}
	t.gid = gid
	mtu := perftest.MTUFromBytes(t.h.Iface.ActiveMTU())
	if t.p.MTU != 0 {
		mtu = min(mtu, t.p.MTU)
	}
	if !mtu.Valid() {
		return t.res, fmt.Errorf("perf: %s's MTU %d is too small for RoCE", t.h.Iface.Name, t.h.Iface.MTU)
	}
	cfg := perftest.Config{Test: t.p.Test, Client: t.client, MTU: mtu, PageSize: 4096, CacheLine: 64}
	out, err := perftest.Run(ctx, conn, cfg, t)
	if err != nil {
		return t.res, err
	}
	if out.PeerReport != nil && !t.client {
		// The passive server prints the client's figures, as perftest does.
		t.res.BW = append(t.res.BW, *out.PeerReport)
		t.printf("%s", perftest.FormatBW(*out.PeerReport, t.p.ReportGbits))
		t.printf("%s", perftest.ResultLine)
	}
	if t.p.Verify {
		if err := t.verifyAfter(out); err != nil {
			return t.res, err
		}
		t.res.Verify = true
	}
	return t.res, nil
}

func (t *Test) printf(format string, a ...any) {
	if !t.quiet && t.out != nil {
		fmt.Fprintf(t.out, format, a...)
	}
}

func (t *Test) info() perftest.Info {
	return perftest.Info{Test: t.p.Test, Device: t.h.Iface.Name, Client: t.client, MTU: t.neg.MTU, TxDepth: t.p.TxDepth,
		RxDepth: t.p.RxDepth, CQMod: t.p.CQMod, OutReads: t.p.OutReads, InlineSize: t.p.InlineSize,
		GIDIndex: t.p.GIDIndex, Duration: t.p.Duration, ReportGbits: t.p.ReportGbits}
}

// JSON returns the result in --json form.
func (t *Test) JSON() *perftest.JSONResult {
	j := perftest.NewJSONResult(t.info())
	for _, r := range t.res.BW {
		j.AddBW(r)
	}
	j.Lat = t.res.Lat
	if t.p.Verify {
		v := t.res.Verify
		j.TestInfo.Verified = &v
	}
	return j
}

// Dests implements perftest.Local: one MR for all QPs, one QP each.
func (t *Test) Dests(n perftest.Negotiated) ([]perftest.Dest, error) {
	t.neg = n
	t.res.MTU = n.MTU.Bytes()
	maxSize := uint64(0)
	for _, s := range n.Sizes {
		maxSize = max(maxSize, s)
	}
	// Room for the peer's addressing: perftest cycles remote addresses
	// within max(size, page size) and may use twice that; and our own
	// receive side uses a second half for SEND targets.
	page := uint64(max(n.PageSize, 4096))
	t.region = int(2 * ((max(maxSize, page) + page - 1) / page * page))
	t.buf = make([]byte, t.region*t.p.QPs)
	var r [12]byte
	rand.Read(r[:])
	t.rkey = binary.LittleEndian.Uint32(r[:4]) | 1 // never 0: perftest shows 0 as "no remote access"
	t.iova = (binary.LittleEndian.Uint64(r[4:]) & 0x00007fff_fffff000) | 0x10000000
	t.fillPattern()
	t.allowed = wr.LocalWrite
	switch t.p.Verb {
	case perftest.Write:
		t.allowed |= wr.RemoteWrite
	case perftest.Read:
		t.allowed |= wr.RemoteRead
	case perftest.Atomic:
		t.allowed |= wr.RemoteAtomic
	}
	var dests []perftest.Dest
	for i := 0; i < t.p.QPs; i++ {
		var pr [4]byte
		rand.Read(pr[:])
		q := &qp{qpn: t.h.NextQPN(), psn: binary.LittleEndian.Uint32(pr[:]) & bth.PSNMask, idx: i,
			src: t.buf[i*t.region : (i+1)*t.region]}
		depth := max(t.p.TxDepth, 1)
		q.rc = rc.New(q.qpn, max(depth, 16), 1, memory{t}, &q.rq)
		t.qps = append(t.qps, q)
		dests = append(dests, perftest.Dest{OutReads: uint16(t.p.OutReads), QPN: q.qpn, PSN: q.psn, RKey: t.rkey,
			VAddr: t.iova + uint64(i*t.region), GID: perftest.GIDFromAddr(t.gid)})
	}
	perftest.WriteBanner(writerOrDiscard(t), t.info())
	for _, d := range dests {
		perftest.WriteDest(writerOrDiscard(t), "local", d, t.p.Verb)
	}
	return dests, nil
}

func writerOrDiscard(t *Test) io.Writer {
	if t.quiet || t.out == nil {
		return io.Discard
	}
	return t.out
}

// pattern is the byte --verify expects at offset i of QP idx's region on
// the side that wrote it: both ends compute it, so no data need be sent.
func pattern(idx, i int, client bool) byte {
	b := byte(i*7+i>>8+idx*31) ^ 0x5a
	if !client {
		b ^= 0xff
	}
	return b
}

// fillPattern fills our MR with our side's pattern: the source of what we
// send or what the peer reads.
func (t *Test) fillPattern() {
	for q := 0; q < t.p.QPs; q++ {
		r := t.buf[q*t.region : (q+1)*t.region]
		for i := range r {
			r[i] = pattern(q, i, t.client)
		}
		if t.p.Verb == perftest.Write && t.p.Measure == perftest.Latency {
			// write_lat polls the last byte of each message for the peer's
			// iteration count, from 1 on: what the peer writes into must
			// start as zeros, as perftest's buffers do, or a pattern byte
			// could pass for a count.
			clear(r[:t.region/2])
		}
	}
}

// Connect implements perftest.Local: RTR and RTS toward the peer's QPs,
// with perftest's attributes (timeout -u, default 14; retry 7, RNR retry 7, min RNR
// timer 12; initiator depth the peer's out_reads), then attach to the engine.
func (t *Test) Connect(remote []perftest.Dest) error {
	t.remote = remote
	for _, d := range remote {
		perftest.WriteDest(writerOrDiscard(t), "remote", d, t.p.Verb)
	}
	peer := remote[0].Addr()
	if peer.Is4() != t.gid.Is4() {
		return fmt.Errorf("perf: peer GID %v and ours %v differ in IP version", peer, t.gid)
	}
	srcMAC, dstMAC, err := t.h.Resolve(t.ctx, peer)
	if err != nil {
		return fmt.Errorf("perf: no route to %v: %w", peer, err)
	}
	access := t.allowed
	for i, q := range t.qps {
		d := remote[i]
		cfg := rc.Config{UC: t.p.Transport == perftest.UC, QPN: q.qpn, DestQPN: d.QPN, MTU: t.neg.MTU.Bytes(),
			SQPSN: bth.PSN(q.psn), RQPSN: bth.PSN(d.PSN), Timeout: t.p.QPTimeout, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12,
			MaxRdAtomic: max(int(d.OutReads), 1), MaxDestRdAtomic: max(t.p.OutReads, 1), Access: access,
			SQDepth: max(t.p.TxDepth, 16), MaxSGE: 1}
		q.mu.Lock()
		q.rc.Receiver(cfg)
		q.rc.Sender(cfg)
		q.mu.Unlock()
		typ := engine.RC
		if t.p.Transport == perftest.UC {
			typ = engine.UC
		}
		err := t.h.Engine.Attach(engine.Attachment{QPN: q.qpn, Type: typ, QP: q.rc, Lock: &q.mu, Path: engine.Path{
			SrcMAC: srcMAC, DstMAC: dstMAC, Src: t.gid, Dst: d.Addr(), TrafficClass: uint8(t.p.TClass),
			HopLimit: uint8(t.p.HopLimit), UDPSrcPort: engine.UDPSourcePort(q.qpn, d.QPN)}})
		if err != nil {
			return err
		}
	}
	return nil
}

// close detaches the QPs.
func (t *Test) close() {
	for _, q := range t.qps {
		t.h.Engine.Detach(q.qpn)
	}
}

// PostReceives implements perftest.Local: rx-depth receives per QP (one
// for latency tests' ping-pong, which reposts as it goes), each into a slot
// of its own, so that a message is never overwritten before it is checked.
func (t *Test) PostReceives(size uint64) error {
	n := t.p.RxDepth
	if t.p.Measure == perftest.Latency {
		n = 1
	}
	inc := roundUp(max(size, 1), uint64(t.neg.CacheLine))
	for _, q := range t.qps {
		q.mu.Lock()
		if uint64(len(q.recvBuf)) < uint64(n)*inc {
			q.recvBuf = make([]byte, uint64(n)*inc)
		}
		q.recvSlots, q.recvInc = n, inc
		for i := 0; i < n; i++ {
			q.rq.post(uint64(i), t.recvSlot(q, i, size), uint32(size))
		}
		q.mu.Unlock()
	}
	t.h.Engine.Kick()
	return nil
}

// recvSlot is the buffer of receive WQE i (reposted with the same i).
func (t *Test) recvSlot(q *qp, i int, size uint64) []byte {
	off := uint64(i%q.recvSlots) * q.recvInc
	return q.recvBuf[off : off+size]
}

func roundUp(v, to uint64) uint64 { return (v + to - 1) / to * to }

// memory is the runner's one MR as the responder sees it.
type memory struct{ t *Test }

// Resolve implements wr.Memory: the one rkey, access flags and bounds.
func (m memory) Resolve(rkey uint32, va, n uint64, access wr.Access) ([]byte, bool) {
	t := m.t
	end := va + n
	if rkey != t.rkey || access&^t.allowed != 0 || va < t.iova || end < va || end > t.iova+uint64(len(t.buf)) {
		return nil, false
	}
	return t.buf[va-t.iova : end-t.iova], true
}

// Invalidate implements wr.Memory: perftest never sends with invalidate.
func (memory) Invalidate(uint32) bool { return false }

// recvQueue is a QP's receive queue, used under the QP's lock: a FIFO
// whose consumed head is reclaimed in bulk, so Take is O(1).
type recvQueue struct {
	q    []wr.RecvWQE
	head int
}

func (r *recvQueue) post(id uint64, b []byte, n uint32) {
	if r.head > 0 && r.head == len(r.q) {
		r.q, r.head = r.q[:0], 0
	} else if r.head >= 1024 && r.head*2 >= len(r.q) {
		r.q = r.q[:copy(r.q, r.q[r.head:])]
		r.head = 0
	}
	r.q = append(r.q, wr.RecvWQE{ID: id, SG: [][]byte{b}, Length: n})
}

// Take implements wr.RecvQueue.
func (r *recvQueue) Take(dst *wr.RecvWQE) bool {
	if r.head == len(r.q) {
		return false
	}
	w := &r.q[r.head]
	r.head++
	sg := append(dst.SG[:0], w.SG...)
	*dst = *w
	dst.SG = sg
	return true
}

// stallLimit is how long a run waits without any progress before it
// declares the peer gone: longer than a QP takes to exhaust its retries
// (8 local ACK timeouts), which ends the run with an error completion
// anyway, and never under 5 s. A lossy path recovering at -u 18 (1 s per
// timeout) must not be mistaken for a dead peer.
func (t *Test) stallLimit() time.Duration {
	return max(5*time.Second, 2*8*rc.AckTimeout(t.p.QPTimeout))
}

// errStall ends a run whose peer stopped answering.
func (t *Test) errStall() error {
	return fmt.Errorf("perf: no progress for %v: the peer stopped answering", t.stallLimit())
}

// poll collects the completions of every QP into each QP's seen list and
// returns how many were new; it yields the CPU when there were none so that
// the engine goroutine runs on a small machine.
func (t *Test) poll() (int, error) {
	n := 0
	for _, q := range t.qps {
		q.mu.Lock()
		wcs := q.rc.TakeCompletions()
		for _, w := range wcs {
			if w.Status != wr.Success {
				q.mu.Unlock()
				return n, fmt.Errorf("perf: QP %#x: work request %d completed with status %d", q.qpn, w.ID, w.Status)
			}
		}
		q.seen = append(q.seen, wcs...)
		n += len(wcs)
		q.mu.Unlock()
	}
	if n == 0 {
		runtime.Gosched()
	}
	return n, t.ctx.Err()
}

func now() int64 { return int64(clock.Now()) }
