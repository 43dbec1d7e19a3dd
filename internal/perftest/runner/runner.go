package runner

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/perftest"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/verbs"
)

// Host is what the runner needs from the machine it runs on.
type Host struct {
	// Device is the RNIC the tests run on: a device of this process (an
	// *rnic.Device an engine drives, which resolves peers' MACs itself)
	// or a softrnic daemon's (a *client.Client). Its GID table is
	// Iface.GIDs, in the same order, so that perftest's -x indexes both.
	Device verbs.Device
	// CM is rdma_cm on Device, for -R: an rdmacm.Agent on a device of
	// this process, the Client itself through a daemon. Nil refuses -R.
	CM    rdmacm.CM
	Iface host.Interface
	// Stats, if set, returns the device's counters safely from the
	// application's goroutine (engine.Loop.DeviceStats: Device.Stats
	// belongs to the engine goroutine). --json reports the DCQCN counters
	// from it; without it they are left out.
	Stats func() rnic.Stats
}

// CongestionFor is the device's congestion control for --cc, --dcqcn,
// --cc-scale and --host-cc (host.ParseCC, host.Congestion): the algorithm's profile at
// its own line rate (DCQCN paper 40 Gb/s, connectx 100 Gb/s; Swift and
// TIMELY 40 Gb/s), dilated by the scale, so that a testbed whose
// bottleneck is the line rate ÷ S sees the profile's dynamics; its pacer
// may burst as host.Congestion allows.
func CongestionFor(p perftest.Params) (rnic.Congestion, error) {
	algo, profile, err := host.ParseCC(p.CC, p.DCQCN)
	if err != nil {
		return rnic.Congestion{}, fmt.Errorf("perf: %w", err)
	}
	hcc, err := dcqcn.ParseHostCC(p.HostCC)
	if err != nil {
		return rnic.Congestion{}, fmt.Errorf("perf: --host-cc: %w", err)
	}
	cc, err := host.Congestion(host.CC{Algorithm: algo, Profile: profile, Scale: p.CCScale, HostCC: hcc})
	if err != nil {
		return cc, fmt.Errorf("perf: --cc %s:%s --cc-scale %g: %w", algo, profile, p.CCScale, err)
	}
	return cc, nil
}

// Result is what a run measured.
type Result struct {
	BW     []perftest.BWReport // bandwidth rows (a passive server: the peer's)
	Lat    []perftest.LatReport
	MTU    int
	Verify bool // --verify checked every byte (false: not asked)
	// CC is each QP's congestion-control state at the end of the run
	// (empty with it off), taken before the QPs are destroyed.
	CC []QPCongestion
	// Recovery sums the loss recovery counters of the run's RC QPs at
	// its end (nil: not RC, or the device does not count them).
	Recovery *verbs.RecoveryCounters
	// Peer is the address of the peer's GID.
	Peer netip.Addr
}

// QPCongestion is one QP's congestion-control state at the end of a run.
type QPCongestion struct {
	QPN uint32
	congestion.State
}

// udQKey is the Q_Key perftest gives its UD QPs (DEF_QKEY).
const udQKey = 0x11111111

// grhLen is the GRH slot at the start of every UD receive buffer.
const grhLen = 40

// Test is one run of a perftest program.
type Test struct {
	h      Host
	p      perftest.Params
	client bool
	out    io.Writer
	quiet  bool

	headerDone bool
	allowed    ib.Access    // what the peer may do to our MR
	dev        verbs.Device // Host.Device
	local      *rnic.Device // Host.Device if it is a device of this process
	poller     verbs.Poller // Host.Device's, if it has one

	neg     perftest.Negotiated
	gid     netip.Addr
	gidIdx  int // index of gid in the device's GID table
	region  int // bytes of the MR per QP
	pd      verbs.PD
	mr      verbs.MR  // region bytes per QP
	mem     verbs.Mem // the MR's memory
	buf     []byte    // mem's bytes
	qps     []*qp
	qpns    []uint32 // the QPs' numbers (transportProgress)
	remote  []perftest.Dest
	res     Result
	ctx     context.Context
	udDatum bool // UD: receive buffers start with the GRH slot

	paceTimer *time.Timer // idle's, made on first use
}

// qp is one QP and the state the application side keeps for it.
type qp struct {
	qp   verbs.QP
	cq   verbs.CQ
	ah   verbs.AH // UD: the peer's address handle
	psn  uint32
	idx  int
	src  []byte // local source/sink area: the QP's region of the MR
	va   uint64 // IOVA of src
	seen []ib.WC
	wcs  [64]ib.WC

	// One WR and SGE per QP, reused by every post (PostSend copies what
	// it needs), so that a message costs no allocation on this side.
	wr  [1]verbs.SendWR
	sge [1]ib.SGE
	rwr [1]verbs.RecvWR
	rsg [1]ib.SGE

	recvMem  verbs.Mem // receive slots
	recvMR   verbs.MR  // over recvMem (local write only)
	recvBusy []bool    // slot i has a receive posted
	recvLen  uint64    // bytes of a receive buffer
	recvInc  uint64    // distance between slots
}

// QPN is the QP's number.
func (q *qp) qpn() uint32 { return q.qp.QPN() }

// New prepares a test; Exec runs it.
func New(h Host, p perftest.Params, client bool, out io.Writer) *Test {
	t := &Test{h: h, p: p, client: client, out: out, quiet: p.JSON, dev: h.Device}
	t.local, _ = h.Device.(*rnic.Device)
	t.poller, _ = h.Device.(verbs.Poller)
	return t
}

// congestion is the device's congestion control, its profile and time
// dilation, and whether it runs (through the daemon: as the daemon's
// configuration says).
func (t *Test) congestion() (algorithm, profile string, scale float64, on bool) {
	if c, ok := t.dev.(verbs.CongestionProfiler); ok {
		algorithm, profile, scale = c.CongestionProfile()
	}
	return algorithm, profile, scale, algorithm != "" && algorithm != "off"
}

// Exec runs the test over the side channel conn, returns what it measured
// and always destroys its QPs and MRs.
func (t *Test) Exec(ctx context.Context, conn io.ReadWriter) (_ Result, err error) {
	t.ctx = ctx
	defer func() { err = errors.Join(err, t.close()) }()
	if t.dev == nil {
		return t.res, errors.New("perf: no device")
	}
	t.udDatum = t.p.Transport == perftest.UD
	t.gidIdx = t.p.GIDIndex
	gid, err := t.h.Iface.GID(t.p.GIDIndex)
	if err != nil {
		return t.res, err
	}
	if t.gidIdx < 0 {
		for i, g := range t.h.Iface.GIDs {
			if g == gid {
				t.gidIdx = i
				break
			}
		}
	}
	t.gid = gid
	mtu := perftest.MTUFromBytes(int(t.dev.Query().ActiveMTU))
	if t.p.MTU != 0 {
		mtu = min(mtu, t.p.MTU)
	}
	if !mtu.Valid() {
		return t.res, fmt.Errorf("perf: %s's MTU %d is too small for RoCE", t.h.Iface.Name, t.h.Iface.MTU)
	}
	cfg := perftest.Config{Test: t.p.Test, Client: t.client, MTU: mtu, PageSize: 4096, CacheLine: 64}
	out, err := perftest.Run(ctx, conn, cfg, t)
	t.snapshotCC()
	if err != nil {
		return t.res, err
	}
	if out.PeerReport != nil && !t.client {
		// The passive server prints the client's figures, as perftest does.
		t.res.BW = append(t.res.BW, *out.PeerReport)
		t.print(perftest.FormatBW(*out.PeerReport, t.p.ReportGbits))
		t.print(perftest.ResultLine)
	}
	if t.p.Verify {
		if err := t.verifyAfter(out); err != nil {
			return t.res, err
		}
		t.res.Verify = true
	}
	return t.res, nil
}

func (t *Test) print(s string) {
	if !t.quiet && t.out != nil {
		fmt.Fprint(t.out, s)
	}
}

func (t *Test) info() perftest.Info {
	return perftest.Info{Test: t.p.Test, Device: t.h.Iface.Name, Client: t.client, MTU: t.neg.MTU, TxDepth: t.p.TxDepth,
		RxDepth: t.p.RxDepth, CQMod: t.p.CQMod, OutReads: t.p.OutReads, InlineSize: t.p.InlineSize,
		GIDIndex: t.p.GIDIndex, Duration: t.p.Duration, ReportGbits: t.p.ReportGbits}
}

// snapshotCC records each QP's congestion-control state and the QPs' loss
// recovery counters while the QPs still exist.
func (t *Test) snapshotCC() {
	if rcn, ok := t.dev.(verbs.RecoveryCounter); ok && t.qpType() == ib.RC {
		c := rcn.RecoveryCounters(t.qpns)
		t.res.Recovery = &c
	}
	t.res.CC = t.res.CC[:0]
	for _, q := range t.qps {
		c, ok := q.qp.(verbs.CongestionStater)
		if !ok {
			continue
		}
		if st, ok := c.CongestionState(); ok {
			t.res.CC = append(t.res.CC, QPCongestion{QPN: q.qpn(), State: st})
		}
	}
}

// JSON returns the result in --json form.
func (t *Test) JSON() *JSONResult {
	j := perftest.NewJSONResult(t.info())
	for _, r := range t.res.BW {
		j.AddBW(r)
	}
	j.Lat = t.res.Lat
	if t.p.Verify {
		v := t.res.Verify
		j.TestInfo.Verified = &v
	}
	out := &JSONResult{JSONResult: j}
	if t.res.Recovery != nil {
		mode := t.p.Recovery
		if mode == ib.RecoveryDefault {
			mode = t.deviceRecovery()
		}
		out.Recovery = &RecoveryJSON{Mode: mode.String(), RecoveryCounters: *t.res.Recovery}
	}
	algo, profile, scale, on := t.congestion()
	if !on {
		return out
	}
	peer := ""
	if t.res.Peer.IsValid() {
		peer = t.res.Peer.String()
	}
	c := &CCJSON{Algorithm: algo, Profile: profile, Scale: scale, Peer: peer, QPs: []QPCCJSON{}}
	var st rnic.Stats
	if t.h.Stats != nil {
		st = t.h.Stats()
		cs := st.CCCounters.Counters
		c.RTTSamples, c.Decreases, c.LossEvents, c.WindowFull = &cs.RTTSamples, &cs.Decreases, &cs.LossEvents, &cs.WindowFull
	}
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	for _, q := range t.res.CC {
		j := QPCCJSON{QPN: q.QPN, RateMbps: float64(q.Rate) / 1e6, SRTTUs: us(q.SRTT), MinRTTUs: us(q.MinRTT),
			LastRTTUs: us(q.LastRTT), HostDelayUs: us(q.HostDelay), RTTSamples: q.RTTSamples, Decreases: q.Decreases,
			LossEvents: q.LossEvents, WindowFull: q.WindowFull, Cwnd: q.Cwnd, TargetUs: us(q.Target), Gradient: q.Gradient}
		if q.Window != congestion.NoWindow {
			j.WindowBytes, j.InFlightBytes = &q.Window, &q.InFlight
		}
		c.QPs = append(c.QPs, j)
	}
	out.CC = c
	if algo != "dcqcn" {
		return out
	}
	d := &DCQCNJSON{Profile: profile, Scale: scale, Peer: peer, QPs: []QPCongestionJSON{}}
	if t.h.Stats != nil {
		d.ECNMarked, d.CNPSent = &st.NPECNMarkedRoCEPackets, &st.NPCNPSent
		d.CNPHandled, d.CNPIgnored = &st.RPCNPHandled, &st.RPCNPIgnored
		d.HostCCMarks = &st.NPHostCCMarks
	}
	for _, q := range t.res.CC {
		d.QPs = append(d.QPs, QPCongestionJSON{QPN: q.QPN, RateMbps: float64(q.Rate) / 1e6, TargetMbps: float64(q.TargetRate) / 1e6,
			Alpha: q.Alpha, ECNMarked: q.ECNMarked, CNPSent: q.CNPSent,
			CNPHandled: q.CNPHandled, CNPIgnored: q.CNPIgnored, Cuts: q.Cuts})
	}
	out.DCQCN = d
	return out
}

// JSONResult is perftest's --json layout plus, with congestion control
// on, a "cc" object and, under DCQCN, a "dcqcn" object, and for RC a
// "recovery" object.
type JSONResult struct {
	*perftest.JSONResult
	CC       *CCJSON       `json:"cc,omitempty"`
	DCQCN    *DCQCNJSON    `json:"dcqcn,omitempty"`
	Recovery *RecoveryJSON `json:"recovery,omitempty"`
}

// CCJSON is the "cc" object of --json, whatever the algorithm: which one
// runs, its profile and dilation, the device's counters (device-wide, so
// with --clients they count every client's QPs), the peer this run
// served, and each of this run's QPs' final figures and own counts (under
// other names than the device's, so that a tool summing the device names
// does not count them twice).
type CCJSON struct {
	Algorithm  string     `json:"algorithm"`
	Profile    string     `json:"profile"`
	Scale      float64    `json:"scale"`
	RTTSamples *uint64    `json:"cc_rtt_samples,omitempty"`
	Decreases  *uint64    `json:"cc_decreases,omitempty"`
	LossEvents *uint64    `json:"cc_loss_events,omitempty"`
	WindowFull *uint64    `json:"cc_window_full,omitempty"`
	Peer       string     `json:"peer,omitempty"`
	QPs        []QPCCJSON `json:"qps"`
}

// QPCCJSON is one QP in CCJSON: its rate, window and bytes in flight (no
// window: absent), the RTT estimates (µs), and the algorithm's own
// figures (Swift: cwnd in packets and the fabric target; TIMELY: the
// gradient).
type QPCCJSON struct {
	QPN           uint32  `json:"qpn"`
	RateMbps      float64 `json:"rate_mbps"`
	WindowBytes   *int64  `json:"window_bytes,omitempty"`
	InFlightBytes *int64  `json:"inflight_bytes,omitempty"`
	SRTTUs        float64 `json:"srtt_us"`
	MinRTTUs      float64 `json:"min_rtt_us"`
	LastRTTUs     float64 `json:"last_rtt_us"`
	HostDelayUs   float64 `json:"host_delay_us"`
	RTTSamples    uint64  `json:"rtt_samples"`
	Decreases     uint64  `json:"decreases"`
	LossEvents    uint64  `json:"loss_events"`
	WindowFull    uint64  `json:"window_full"`
	Cwnd          float64 `json:"cwnd,omitempty"`
	TargetUs      float64 `json:"target_us,omitempty"`
	Gradient      float64 `json:"gradient,omitempty"`
}

// Write writes the result as indented JSON.
func (j *JSONResult) Write(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(j)
}

// DCQCNJSON is the "dcqcn" object of --json: the profile and dilation, the
// device's counters under their mlx5 names (as `rdma statistic` shows a
// ConnectX port's; device-wide, so with --clients they count every
// client's QPs), the peer this run served, and each of this run's QPs'
// final rate, α and own counts (per QP, under other names so that a tool
// summing the mlx5 names over a device does not count them twice).
type DCQCNJSON struct {
	Profile    string  `json:"profile"`
	Scale      float64 `json:"scale"`
	ECNMarked  *uint64 `json:"np_ecn_marked_roce_packets,omitempty"`
	CNPSent    *uint64 `json:"np_cnp_sent,omitempty"`
	CNPHandled *uint64 `json:"rp_cnp_handled,omitempty"`
	CNPIgnored *uint64 `json:"rp_cnp_ignored,omitempty"`
	// HostCCMarks (np_host_cc_marks): packets the NP answered as
	// CE-marked because this host's receive rings ran low.
	HostCCMarks *uint64            `json:"np_host_cc_marks,omitempty"`
	Peer        string             `json:"peer,omitempty"`
	QPs         []QPCongestionJSON `json:"qps"`
}

// QPCongestionJSON is one QP in DCQCNJSON.
type QPCongestionJSON struct {
	QPN        uint32  `json:"qpn"`
	RateMbps   float64 `json:"rate_mbps"`   // R_C at the end (dilated)
	TargetMbps float64 `json:"target_mbps"` // R_T at the end
	Alpha      float64 `json:"alpha"`
	ECNMarked  uint64  `json:"ecn_marked"`  // CE-marked packets this QP received (NP)
	CNPSent    uint64  `json:"cnp_sent"`    // CNPs this QP's NP asked for
	CNPHandled uint64  `json:"cnp_handled"` // CNPs this QP's RP acted on
	CNPIgnored uint64  `json:"cnp_ignored"` // CNPs coalesced into a pending cut
	Cuts       uint64  `json:"cuts"`        // rate cuts
}

func (t *Test) qpType() ib.QPType {
	switch t.p.Transport {
	case perftest.UC:
		return ib.UC
	case perftest.UD:
		return ib.UD
	default:
		return ib.RC
	}
}

// qpMasks are the attributes a test's QPs set on their way to RTS: what
// IBA requires of their type's transitions.
type qpMasks struct{ init, rtr, rts ib.QPAttrMask }

func (t *Test) masks() qpMasks {
	const s = ib.AttrState
	switch t.qpType() {
	case ib.UD:
		return qpMasks{s | ib.AttrPKeyIndex | ib.AttrPort | ib.AttrQKey, s, s | ib.AttrSQPSN}
	case ib.UC:
		return qpMasks{s | ib.AttrPKeyIndex | ib.AttrPort | ib.AttrAccessFlags,
			s | ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrRQPSN, s | ib.AttrSQPSN}
	default:
		return qpMasks{s | ib.AttrPKeyIndex | ib.AttrPort | ib.AttrAccessFlags,
			s | ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrRQPSN | ib.AttrMaxDestRdAtomic | ib.AttrMinRNRTimer,
			s | ib.AttrSQPSN | ib.AttrTimeout | ib.AttrRetryCnt | ib.AttrRNRRetry | ib.AttrMaxQPRdAtomic}
	}
}

// setupMR makes the PD and the one MR of all QPs, with room for the peer's
// addressing: perftest cycles remote addresses within max(size, page size)
// and may use twice that; and our own receive side uses a second half for
// SEND targets.
func (t *Test) setupMR(n perftest.Negotiated) error {
	t.neg = n
	t.res.MTU = n.MTU.Bytes()
	maxSize := uint64(0)
	for _, s := range n.Sizes {
		maxSize = max(maxSize, s)
	}
	page := uint64(max(n.PageSize, 4096))
	t.region = int(2 * ((max(maxSize, page) + page - 1) / page * page))
	if err := t.allocBuf(); err != nil {
		return err
	}
	t.fillPattern()
	t.allowed = ib.LocalWrite
	switch t.p.Verb {
	case perftest.Write:
		t.allowed |= ib.RemoteWrite
	case perftest.Read:
		t.allowed |= ib.RemoteRead
	case perftest.Atomic:
		t.allowed |= ib.RemoteAtomic
	case perftest.Send:
		// Local access only: the peer posts receives.
	}
	var r [8]byte
	rand.Read(r[:])
	iova := (binary.LittleEndian.Uint64(r[:]) & 0x00007fff_fffff000) | 0x10000000
	var err error
	if t.pd, err = t.dev.AllocPD(); err != nil {
		return err
	}
	t.mr, err = t.pd.RegMR(t.mem, 0, len(t.buf), iova, t.allowed)
	return err
}

// Dests implements perftest.Local: one MR for all QPs, one QP and CQ each,
// each QP moved to INIT so that it has its number.
func (t *Test) Dests(n perftest.Negotiated) ([]perftest.Dest, error) {
	maxSize := uint64(0)
	for _, s := range n.Sizes {
		maxSize = max(maxSize, s)
	}
	if t.udDatum && maxSize > uint64(n.MTU.Bytes()) {
		return nil, fmt.Errorf("perf: UD messages are at most one MTU (%d bytes), not %d", n.MTU.Bytes(), maxSize)
	}
	if err := t.setupMR(n); err != nil {
		return nil, err
	}
	var dests []perftest.Dest
	for i := 0; i < t.p.QPs; i++ {
		q, sq, rq, err := t.newQP(i)
		if err != nil {
			return nil, err
		}
		t.qps = append(t.qps, q) // close destroys its CQ even if the QP fails
		if q.qp, err = t.pd.CreateQP(t.qpAttr(t.qpType(), q.cq, sq, rq)); err != nil {
			return nil, err
		}
		t.qpns = append(t.qpns, q.qpn())
		init := ib.QPAttr{State: ib.Init, Port: 1, Access: t.allowed &^ ib.LocalWrite, QKey: udQKey}
		if err := q.qp.Modify(&init, t.masks().init); err != nil {
			return nil, err
		}
		d := perftest.Dest{OutReads: uint16(t.p.OutReads), QPN: q.qpn(), PSN: q.psn, RKey: t.mr.RKey(),
			VAddr: q.va, GID: perftest.GIDFromAddr(t.gid)}
		if t.udDatum {
			d.RKey, d.VAddr = 0, 0 // no remote access to a UD QP's memory
		}
		dests = append(dests, d)
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
// with perftest's attributes (timeout -u, default 14; retry 7, RNR retry 7,
// min RNR timer 12; initiator depth the peer's out_reads). A UD QP gets an
// address handle to its peer QP instead.
func (t *Test) Connect(remote []perftest.Dest) error {
	t.remote = remote
	for _, d := range remote {
		perftest.WriteDest(writerOrDiscard(t), "remote", d, t.p.Verb)
	}
	peer := remote[0].Addr()
	t.res.Peer = peer
	if peer.Is4() != t.gid.Is4() {
		return fmt.Errorf("perf: peer GID %v and ours %v differ in IP version", peer, t.gid)
	}
	// The RNIC resolves the peer's MAC (RTR, address handles): a device
	// of this process through its Config.Resolve, the daemon's its own.
	var err error
	for i, q := range t.qps {
		d := remote[i]
		av := ib.AddressVector{DGID: ib.GIDFrom(d.Addr()), SGIDIndex: uint8(t.gidIdx),
			TrafficClass: uint8(t.p.TClass), HopLimit: uint8(t.p.HopLimit)}
		rtr := ib.QPAttr{State: ib.RTR, PathMTU: uint32(t.neg.MTU.Bytes()), DestQPN: d.QPN, RQPSN: d.PSN,
			MaxDestRdAtomic: uint8(min(max(t.p.OutReads, 1), 255)), MinRNRTimer: 12, AV: av}
		rts := ib.QPAttr{State: ib.RTS, SQPSN: q.psn, Timeout: t.p.QPTimeout, RetryCnt: 7, RNRRetry: 7,
			MaxRdAtomic: uint8(min(max(int(d.OutReads), 1), 255))}
		if t.udDatum {
			av.UDPSrcPort = rnic.UDSourcePort(q.qpn()) // per QP, as rxe's UD frames
			if q.ah, err = t.pd.CreateAH(&av); err != nil {
				return fmt.Errorf("perf: address handle to %v: %w", d.Addr(), err)
			}
		}
		if err := q.qp.Modify(&rtr, t.masks().rtr); err != nil {
			return fmt.Errorf("perf: QP %#x to RTR: %w", q.qpn(), err)
		}
		if err := q.qp.Modify(&rts, t.masks().rts); err != nil {
			return fmt.Errorf("perf: QP %#x to RTS: %w", q.qpn(), err)
		}
	}
	return nil
}

// allocBuf allocates the memory of the one MR of all QPs: memory the RNIC
// can register (through the daemon, shared with it).
func (t *Test) allocBuf() error {
	m, err := t.dev.AllocMem(t.region * t.p.QPs)
	if err != nil {
		return err
	}
	t.mem, t.buf = m, m.Bytes()
	return nil
}

// close destroys the QPs, AHs and CQs, deregisters the MRs and frees their
// memory, and deallocates the PD, in the order verbs requires.
func (t *Test) close() error {
	var errs []error
	for _, q := range t.qps {
		if q.qp != nil {
			errs = append(errs, q.qp.Destroy())
		}
		if q.ah != nil {
			errs = append(errs, q.ah.Destroy())
		}
		if q.recvMR != nil {
			errs = append(errs, q.recvMR.Dereg())
		}
		if q.recvMem != nil {
			errs = append(errs, q.recvMem.Free())
		}
		if q.cq != nil {
			errs = append(errs, q.cq.Destroy())
		}
	}
	if t.mr != nil {
		errs = append(errs, t.mr.Dereg())
	}
	if t.mem != nil {
		errs = append(errs, t.mem.Free())
	}
	if t.pd != nil {
		errs = append(errs, t.pd.Dealloc())
	}
	return errors.Join(errs...)
}

// slotLen is the length of a receive buffer for messages of size bytes.
func (t *Test) slotLen(size uint64) uint64 {
	if t.udDatum {
		return size + grhLen
	}
	return size
}

// PostReceives implements perftest.Local: rx-depth receives per QP (one
// for latency tests' ping-pong, which reposts as it goes), each into a slot
// of its own, so that a message is never overwritten before it is checked.
// A receive's WR ID is its slot. Slots are as large as the largest message
// of the run, so that with -a the receives still posted from the previous
// size take messages of the next one; only free slots are posted again.
func (t *Test) PostReceives(size uint64) error {
	n := t.p.RxDepth
	if t.p.Measure == perftest.Latency {
		n = 1
	}
	for _, q := range t.qps {
		if q.recvMR == nil {
			maxSize := size
			for _, s := range t.neg.Sizes {
				maxSize = max(maxSize, s)
			}
			q.recvLen = t.slotLen(maxSize)
			q.recvInc = roundUp(max(q.recvLen, 1), uint64(t.neg.CacheLine))
			mem, err := t.dev.AllocMem(int(uint64(n) * q.recvInc))
			if err != nil {
				return err
			}
			q.recvMem = mem
			mr, err := t.pd.RegMR(mem, 0, len(mem.Bytes()), 0, ib.LocalWrite)
			if err != nil {
				return err
			}
			q.recvMR, q.recvBusy = mr, make([]bool, n)
		}
		for i := range q.recvBusy {
			if !q.recvBusy[i] {
				if err := t.postRecv(q, uint64(i)); err != nil {
					return err
				}
			}
		}
		// The peer starts sending when we say so on the side channel: the
		// receives must be in the device by then (through the daemon they
		// are still on their way; a UC/UD SEND finding none is lost).
		if rs, ok := q.qp.(verbs.RecvSyncer); ok {
			sctx, cancel := context.WithTimeout(t.ctx, t.stallLimit())
			err := rs.SyncRecv(sctx)
			cancel()
			if err != nil {
				return fmt.Errorf("perf: %w", err)
			}
		}
	}
	return nil
}

// postRecv posts the receive of slot id.
func (t *Test) postRecv(q *qp, id uint64) error {
	q.rsg[0] = ib.SGE{Addr: q.recvMR.IOVA() + id*q.recvInc, Length: uint32(q.recvLen), LKey: q.recvMR.LKey()}
	q.rwr[0] = verbs.RecvWR{ID: id, SG: q.rsg[:]}
	if _, err := q.qp.PostRecv(q.rwr[:]); err != nil {
		return fmt.Errorf("perf: QP %#x: post receive: %w", q.qpn(), err)
	}
	q.recvBusy[id] = true
	return nil
}

// recvData is the message of size bytes received into slot id (after the
// GRH slot on UD).
func (t *Test) recvData(q *qp, id uint64, size uint64) []byte {
	off := id * q.recvInc
	if t.udDatum {
		off += grhLen
	}
	return q.recvMem.Bytes()[off : off+size]
}

func roundUp(v, to uint64) uint64 { return (v + to - 1) / to * to }

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
func (t *Test) poll() (int, error) { return t.pollFor(false) }

// pollFor is poll for a caller that waits for a completion (memory
// false) or for a byte of memory a peer writes (memory true).
func (t *Test) pollFor(memory bool) (int, error) {
	n := 0
	for _, q := range t.qps {
		k := q.cq.Poll(q.wcs[:])
		for _, w := range q.wcs[:k] {
			if w.Status != ib.Success {
				return n, fmt.Errorf("perf: QP %#x: work request %d completed with status %v", q.qpn(), w.ID, w.Status)
			}
		}
		q.seen = append(q.seen, q.wcs[:k]...)
		n += k
	}
	if n == 0 {
		t.idle(memory)
	}
	return n, t.ctx.Err()
}

// idle is what poll does when it found nothing. perftest busy-polls, and so
// do we (yielding, so that the engine goroutine runs on a small machine),
// except on one QP paced by congestion control: its completions come at its rate, so
// polling faster gains nothing and takes the CPU from the engines of this
// and the other flows on the host (live, two paced write_bw clients and a
// server on two loaded cores sent 60-70 % of their reaction points' rates).
// There poll sleeps on the CQ's doorbell, at most paceWait, and the engine
// keeps posting completions meanwhile.
func (t *Test) idle(memory bool) {
	nt, ok := t.qps[0].cq.(verbs.Notifier)
	if _, _, _, on := t.congestion(); len(t.qps) != 1 || t.p.Measure != perftest.BW || !on || !ok {
		// Busy polling: an in-process device's engine step runs in this
		// goroutine while its engine goroutine naps (rnic.Device.Poll);
		// the daemon's client waits for a completion, its CPU given to
		// the daemon (client.Client.Poll), unless what we wait for is a
		// byte a peer writes, which no completion announces.
		if t.poller == nil || memory && t.local == nil || !t.poller.Poll() {
			runtime.Gosched()
		}
		return
	}
	if t.paceTimer == nil {
		t.paceTimer = time.NewTimer(paceWait)
	} else {
		t.paceTimer.Reset(paceWait)
	}
	select {
	case <-nt.Notify():
	case <-t.paceTimer.C:
	case <-t.ctx.Done():
	}
	t.paceTimer.Stop()
}

// paceWait bounds idle's sleep: the -D deadline and the stall check are
// seen within it.
const paceWait = time.Millisecond

func now() int64 { return int64(clock.Now()) }

// qpAttr is the QP of perftest's: type typ, depths sq and rq, one SGE,
// on one CQ.
func (t *Test) qpAttr(typ ib.QPType, cq verbs.CQ, sq, rq int) *verbs.QPInitAttr {
	return &verbs.QPInitAttr{Type: typ, SendCQ: cq, RecvCQ: cq, Recovery: t.p.Recovery,
		Cap: ib.QPCaps{MaxSendWR: uint32(sq), MaxRecvWR: uint32(rq), MaxSendSGE: 1, MaxRecvSGE: 1}}
}

// withLock runs fn under q's lock where the device has one (an in-process
// device's QP: its engine writes the QP's memory under it), else at once.
func withLock(q verbs.QP, fn func()) {
	if l, ok := q.(verbs.Locker); ok {
		l.WithLock(fn)
		return
	}
	fn()
}

// newQP prepares QP i's slot: the PSN its record announces (drawn at
// random, as perftest does), its share of the buffer and one CQ deep
// enough for both queues. It returns the queue depths to create the QP
// with; the caller creates or connects it.
func (t *Test) newQP(i int) (q *qp, sq, rq int, err error) {
	var pr [4]byte
	rand.Read(pr[:])
	q = &qp{psn: binary.LittleEndian.Uint32(pr[:]) & bth.PSNMask, idx: i,
		src: t.buf[i*t.region : (i+1)*t.region], va: t.mr.IOVA() + uint64(i*t.region)}
	sq, rq = max(t.p.TxDepth, 16), max(t.p.RxDepth, 16)
	if q.cq, err = t.dev.CreateCQ(sq + rq + 64); err != nil {
		return nil, 0, 0, err
	}
	return q, sq, rq, nil
}

// deviceRecovery is the recovery mode of the device's QPs that do not
// choose their own, where the device says (RecoveryDefault otherwise).
func (t *Test) deviceRecovery() ib.Recovery {
	if t.local != nil {
		return t.local.Config().Recovery
	}
	return ib.RecoveryDefault
}

// RecoveryJSON is the "recovery" object of --json: the QPs' loss recovery
// mode ("default": the daemon's) and their counters summed at the end of
// the run, under softrnic stats' names.
type RecoveryJSON struct {
	Mode string `json:"mode"`
	verbs.RecoveryCounters
}
