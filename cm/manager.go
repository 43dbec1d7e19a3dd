package cm

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/softrnic/softrnic/clock"
)

// Defaults, as the Linux rdma_cm uses them on RoCE (cma.c): CM response
// timeout 20 (≈ 4.3 s), 15 CM retries, packet life time 18 (≈ 1.07 s; the
// 6.1 kernels of the lab and the captures; later kernels use 16); rxe's CA
// ACK delay is 15. From the last two the kernel derives the local ACK
// timeout of its REQs: 19 (≈ 2.1 s), as the captures show.
const (
	DefaultCMResponseTimeout = 20
	DefaultMaxCMRetries      = 15
	DefaultPacketLifeTime    = 18
	DefaultTargetACKDelay    = 15
	DefaultHopLimit          = 64
	// DefaultMaxHalfOpen bounds the passive entries of a port that are not
	// (yet) established: as many as Linux's default listen backlog
	// (somaxconn, 4096). An entry holds under half a KiB, so the cap keeps
	// a REQ flood under ~2 MiB and bounds the QPs the owner creates for it.
	DefaultMaxHalfOpen = 4096
	// DefaultMaxHalfOpenPerPeer bounds them per peer address, so that one
	// flooding host cannot take every slot from the others.
	DefaultMaxHalfOpenPerPeer = 256
	// MaxPeerTimeout bounds the exponents a peer sets for the timers of our
	// passive entry until it is established (its REQ's CM response timeouts
	// and local ACK timeout, its MRA's service timeout): 24 is
	// ≈ 69 s, above any stack's default (Linux: 20), where 31 would be
	// 2.4 h per try and let a few forged REQs hold the half-open slots for
	// 39 h. Past it we only resend sooner and give up sooner.
	MaxPeerTimeout = 24
	permissiveLID  = 0xFFFF
	defaultPKey    = 0xFFFF
)

// Config configures a Manager: one per RoCE port (one GSI QP).
type Config struct {
	// CAGUID is this port's channel-adapter GUID, sent in REQ and REP and
	// used by the peer to recognise duplicates (EUI-64 of the MAC, as rxe).
	CAGUID uint64
	// Seed seeds the choice of communication IDs and transaction IDs, so
	// that a run is reproducible; give each Manager its own.
	Seed uint64
	// CMResponseTimeout is how long (4.096 µs × 2^t) this side may take to
	// answer and what it allows the peer; DefaultCMResponseTimeout if 0.
	CMResponseTimeout uint8
	// MaxCMRetries bounds retransmissions of our REQ and DREQ (the peer's
	// REQ sets it for our REP); DefaultMaxCMRetries if 0.
	MaxCMRetries uint8
	// PacketLifeTime is the one-way path life time exponent, added twice
	// to every response timeout; DefaultPacketLifeTime if 0.
	PacketLifeTime uint8
	// TargetACKDelay is this side's CA ACK delay: advertised in its REP and
	// with PacketLifeTime the base of its REQs' local ACK timeout;
	// DefaultTargetACKDelay if 0.
	TargetACKDelay uint8
	// MaxHalfOpen caps the passive connections and SIDR requests that are
	// not established: from the REQ (or SIDR_REQ) until RTU, or, for one
	// that never gets there (rejected, REP unanswered, SIDR answered),
	// until its entry is released. A REQ or SIDR_REQ that would exceed it
	// is dropped and counted (Stats.HalfOpenDropped): the peer's CM
	// retries it, and a retry that finds room proceeds, as a TCP SYN
	// finds room in a full backlog later. Established connections never
	// count and are never evicted. DefaultMaxHalfOpen if 0.
	MaxHalfOpen int
	// MaxHalfOpenPerPeer is the same cap per peer address;
	// DefaultMaxHalfOpenPerPeer if 0. At most MaxHalfOpen.
	MaxHalfOpenPerPeer int
}

// ConnID names a connection (or SIDR request) inside a Manager: it is the
// local communication ID (or SIDR request ID) on the wire.
type ConnID uint32

// State is a connection's CM state (IBA 12.9.6, figure 145).
type State uint8

const (
	StateIdle        State = iota // unknown / gone
	StateREQSent                  // active: REQ sent, waiting for REP
	StateMRAREQRcvd               // active: the peer MRA'd our REQ
	StateREQRcvd                  // passive: REQ given to the application
	StateMRAREQSent               // passive: we MRA'd the REQ
	StateREPSent                  // passive: REP sent, waiting for RTU
	StateMRAREPRcvd               // passive: the peer MRA'd our REP
	StateEstablished              // both: connected
	StateDREQSent                 // we asked to disconnect
	StateTimeWait                 // disconnected; comm ID held until stray MADs die
	StateSIDRREQSent              // active UD: SIDR_REQ sent
	StateSIDRREQRcvd              // passive UD: SIDR_REQ given to the application
	StateSIDRREPSent              // passive UD: answered; kept to answer duplicates
	StateREPRcvd                  // active, RTU deferred: REP received, waiting for Establish
)

var stateNames = [...]string{"IDLE", "REQ_SENT", "MRA_REQ_RCVD", "REQ_RCVD", "MRA_REQ_SENT", "REP_SENT",
	"MRA_REP_RCVD", "ESTABLISHED", "DREQ_SENT", "TIMEWAIT", "SIDR_REQ_SENT", "SIDR_REQ_RCVD", "SIDR_REP_SENT", "REP_RCVD"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "State(?)"
}

// QPAttr is what the QP owner programs into the connection's QP. For an
// RC QP: RTR takes RemoteQPN, RQPSN, PathMTU, MaxDestRdAtomic and the
// address; RTS takes SQPSN, Timeout, RetryCount, RNRRetry, MaxRdAtomic.
//
// The PSNs follow the Linux CM, which every RoCE peer we meet runs: the
// Starting PSN of a REQ or REP is the PSN its sender expects to receive.
// So RQPSN is the Starting PSN of our own REQ or REP and SQPSN that of the
// peer's (the kernel's ib_send_cm_req/ib_send_cm_rep keep their message's
// as rq_psn, cm_req_handler/cm_rep_handler take the peer's as sq_psn).
// The other reading connects but makes each side drop the other's first
// packet as a duplicate.
type QPAttr struct {
	QPN             uint32 // the local QP (0 in EventConnRequest: not chosen yet)
	RemoteQPN       uint32
	RQPSN           uint32 // first PSN expected from the peer: our REQ's/REP's Starting PSN (0 in EventConnRequest)
	SQPSN           uint32 // first PSN we send: the peer's REQ's/REP's Starting PSN
	PathMTU         uint8  // IB enum: 1=256, 2=512, 3=1024, 4=2048, 5=4096
	MaxDestRdAtomic uint8  // READ/atomic requests we accept at once (responder resources)
	MaxRdAtomic     uint8  // READ/atomic requests we may have outstanding (initiator depth)
	Timeout         uint8  // local ACK timeout, 4.096 µs × 2^t
	RetryCount      uint8
	RNRRetry        uint8
	PKey            uint16
	Peer            netip.Addr // the peer's GID as an IP address
	FlowLabel       uint32
	TrafficClass    uint8
	HopLimit        uint8
}

// EventKind says what an Event asks of the QP owner.
type EventKind uint8

const (
	// EventConnRequest (passive): a REQ for a listened service. Create a
	// QP, move it to RTR with QP (adding its QPN), then Accept, or Reject.
	EventConnRequest EventKind = iota + 1
	// EventEstablished (both): the connection is up; move the QP to RTS
	// with QP (the active side also to RTR first: QP holds both).
	EventEstablished
	// EventRejected: the peer rejected our REQ or REP (Reason).
	EventRejected
	// EventTimeout: our REQ or REP went unanswered MaxCMRetries+1 times;
	// a REJ (timeout) was sent. Destroy the QP.
	EventTimeout
	// EventDisconnectRequest: the peer sent DREQ; a DREP was sent. Move
	// the QP to the error state (flushing its WRs).
	EventDisconnectRequest
	// EventDisconnected: our DREQ was answered (or timed out). Move the QP
	// to the error state.
	EventDisconnected
	// EventTimeWaitExit: the comm ID is released; the QP may be destroyed
	// or reused.
	EventTimeWaitExit
	// EventSIDRRequest (passive): a SIDR_REQ for a listened UD service;
	// answer with SIDRReply.
	EventSIDRRequest
	// EventSIDRReply (active): the SIDR_REP: QP.RemoteQPN and QKey name
	// the service's UD QP when SIDRStatus is SIDRSuccess.
	EventSIDRReply
	// EventSIDRTimeout (active): no SIDR_REP after all retries.
	EventSIDRTimeout
	// EventConnResponse (active, ConnectParams.DeferRTU): the REP; QP
	// holds RTR's and RTS's attributes. Move the QP to RTR and RTS, then
	// Establish (which sends the RTU), or Reject.
	EventConnResponse
)

var eventNames = [...]string{"", "CONN_REQUEST", "ESTABLISHED", "REJECTED", "TIMEOUT", "DISCONNECT_REQUEST",
	"DISCONNECTED", "TIMEWAIT_EXIT", "SIDR_REQUEST", "SIDR_REPLY", "SIDR_TIMEOUT", "CONN_RESPONSE"}

func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "EventKind(?)"
}

// MaxPrivateData is the largest private data any CM message carries (RTU).
const MaxPrivateData = RTUPrivateSize

// Event is one thing the QP owner must act on.
type Event struct {
	Kind       EventKind
	ID         ConnID
	Peer       netip.Addr // where the peer's MADs come from
	ServiceID  uint64
	QP         QPAttr
	Reason     RejectReason // EventRejected
	SIDRStatus SIDRStatus   // EventSIDRReply
	QKey       uint32       // EventSIDRReply
	PKey       uint16       // EventSIDRRequest
	// TimedOut: an EventDisconnected whose DREQ went unanswered through
	// every retry (rdma_cm reports it with -ETIMEDOUT).
	TimedOut bool
	// CMA is the rdma_cm header of a REQ or SIDR_REQ for a listener that
	// asked for it (ListenOptions.RDMACM); PrivateData then holds only the
	// user's part.
	CMA            CMAHeader
	HasCMA         bool
	PrivateData    [MaxPrivateData]byte
	PrivateDataLen int
}

// Private returns the event's private data.
func (e *Event) Private() []byte { return e.PrivateData[:e.PrivateDataLen] }

// Send is a MAD to transmit: a UD SEND_ONLY to QP 1 at To, Q_Key GSIQKey,
// P_Key 0xFFFF, source QP 1.
type Send struct {
	To  netip.Addr
	MAD [MADSize]byte
}

// Stats counts what the Manager did.
type Stats struct {
	Rx          [16]uint64 // received MADs by AttrID-0x10 (REQ=0 … APR=10)
	Tx          [16]uint64 // sent MADs by AttrID-0x10
	Retransmits uint64     // REQ, REP, DREQ, SIDR_REQ sent again on timeout
	Duplicates  uint64     // duplicate REQ, REP, DREQ, SIDR_REQ answered or dropped
	Malformed   uint64     // MADs refused by ParseMAD
	Unmatched   uint64     // MADs for no connection or in the wrong state
	Unsupported uint64     // LAP, APR, ClassPortInfo and unknown attributes
	// HalfOpenDropped counts new REQs and SIDR_REQs dropped because the
	// port's or the peer's half-open cap (Config.MaxHalfOpen,
	// MaxHalfOpenPerPeer) was reached: a flood, or a burst the peer's
	// retries will bring back.
	HalfOpenDropped uint64
	NoListener      uint64 // REQs and SIDR_REQs for a service nobody listens on (REJ 8, SIDR unsupported)
	Timeouts        uint64 // exchanges given up: a REQ, REP, DREQ or SIDR_REQ unanswered, a request never answered
}

// Errors of the Manager's API.
var (
	ErrListening     = errors.New("cm: service ID already listened on")
	ErrNotListening  = errors.New("cm: service ID not listened on")
	ErrNoConn        = errors.New("cm: no such connection")
	ErrBadState      = errors.New("cm: connection is not in a state that allows this")
	ErrPrivateTooBig = errors.New("cm: private data too long for the message")
	ErrBadParams     = errors.New("cm: invalid parameters")
)

// ListenOptions describe a listener.
type ListenOptions struct {
	// RDMACM: REQs and SIDR_REQs carry the rdma_cm IP header at the head of
	// their private data; a REQ without a valid one is rejected (reason 28,
	// consumer defined, as rdma_cm does).
	RDMACM bool
	// Addr, when valid, accepts only REQs whose rdma_cm destination address
	// is Addr (a listener bound to one address).
	Addr netip.Addr
}

// ConnectParams describe an active connection attempt.
type ConnectParams struct {
	Peer, Local            netip.Addr // GIDs as IP addresses
	ServiceID              uint64
	QPN                    uint32
	StartingPSN            uint32 // in the REQ: the first PSN we expect from the peer, our RQPSN (see QPAttr)
	PathMTU                uint8  // IB enum
	ResponderResources     uint8  // READ/atomics we accept at once
	InitiatorDepth         uint8  // READ/atomics we will have outstanding
	RetryCount, RNRRetry   uint8  // what the passive side's QP should use
	LocalACKTimeout        uint8  // 0: from our CA ACK delay and the packet life time, as the kernel
	HopLimit, TrafficClass uint8
	FlowLabel              uint32
	// RDMACM prefixes PrivateData with an rdma_cm header from Local, Peer
	// and SrcPort (then at most CMAUserSize bytes of PrivateData fit).
	RDMACM      bool
	SrcPort     uint16
	PrivateData []byte
	// DeferRTU: the REP is reported as EventConnResponse and the RTU goes
	// only when the owner calls Establish, once its QP is in RTS (rdma_cm's
	// CONNECT_RESPONSE and rdma_establish; the owner may also Reject).
	// Without it the REP brings EventEstablished and the RTU at once.
	DeferRTU bool
}

// AcceptParams answer an EventConnRequest.
type AcceptParams struct {
	QPN                uint32
	StartingPSN        uint32 // in the REP: the first PSN we expect from the peer, the RQPSN of the QP's RTR (see QPAttr)
	ResponderResources uint8  // clamped to the REQ's initiator depth
	InitiatorDepth     uint8  // clamped to the REQ's responder resources
	RNRRetry           uint8  // what the active side's QP should use
	SRQ                bool
	PrivateData        []byte // at most REPPrivateSize
}

// conn is one connection or SIDR transaction.
type conn struct {
	id        ConnID
	state     State
	active    bool
	peer      netip.Addr
	serviceID uint64
	tid       uint64
	remoteID  uint32
	guid      uint64 // the peer's CA GUID
	remoteKey remoteKey
	indexed   bool // present in Manager.remote

	qp QPAttr // accumulates as the handshake proceeds

	// Retransmission of the last request that awaits an answer.
	msg        [MADSize]byte
	deadline   clock.Time
	timeout    time.Duration
	retries    uint8
	maxRetries uint8
	// peerTimeout is the peer's CM response time plus two packet life
	// times: how long to wait for the peer to answer anything.
	peerTimeout time.Duration
	mraTimeout  uint8 // service timeout of the MRA we sent (duplicates resend it)
	// rejected: we refused the peer's REQ; the REJ is in msg and is sent
	// again for duplicates of the REQ until the peer stops retrying.
	rejected bool
	// halfOpen: a passive entry that counts against the half-open caps
	// (created by a peer's REQ or SIDR_REQ and not established).
	halfOpen bool
	// deferRTU: active, the RTU waits for Establish (ConnectParams.DeferRTU).
	deferRTU bool
}

type remoteKey struct {
	peer netip.Addr
	guid uint64
	id   uint32
}

// Manager runs the CM protocol of one port. It is not safe for concurrent
// use: the engine calls it from the goroutine that owns QP1.
type Manager struct {
	cfg       Config
	rng       *rand.Rand
	tidHigh   uint64
	listeners map[uint64]ListenOptions
	conns     map[ConnID]*conn
	remote    map[remoteKey]*conn // by the peer's comm ID (or SIDR request ID)
	events    [2][]Event
	sends     [2][]Send
	cur       int
	stats     Stats
	expired   []ConnID
	// halfOpen counts the entries with conn.halfOpen set, in all and by
	// peer address (a peer is present only while it has some).
	halfOpen       int
	halfOpenByPeer map[netip.Addr]int
}

// New returns a Manager for one port.
func New(cfg Config) *Manager {
	if cfg.CMResponseTimeout == 0 {
		cfg.CMResponseTimeout = DefaultCMResponseTimeout
	}
	if cfg.MaxCMRetries == 0 {
		cfg.MaxCMRetries = DefaultMaxCMRetries
	}
	if cfg.PacketLifeTime == 0 {
		cfg.PacketLifeTime = DefaultPacketLifeTime
	}
	if cfg.TargetACKDelay == 0 {
		cfg.TargetACKDelay = DefaultTargetACKDelay
	}
	cfg.CMResponseTimeout = min(cfg.CMResponseTimeout, 31)
	cfg.MaxCMRetries = min(cfg.MaxCMRetries, 15)
	cfg.PacketLifeTime = min(cfg.PacketLifeTime, 30)
	cfg.TargetACKDelay = min(cfg.TargetACKDelay, 31)
	if cfg.MaxHalfOpen <= 0 {
		cfg.MaxHalfOpen = DefaultMaxHalfOpen
	}
	if cfg.MaxHalfOpenPerPeer <= 0 {
		cfg.MaxHalfOpenPerPeer = DefaultMaxHalfOpenPerPeer
	}
	cfg.MaxHalfOpenPerPeer = min(cfg.MaxHalfOpenPerPeer, cfg.MaxHalfOpen)
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x636d5f6d616e6167)) // "cm_manag"
	return &Manager{
		cfg:       cfg,
		rng:       rng,
		tidHigh:   uint64(rng.Uint32()) << 32,
		listeners: make(map[uint64]ListenOptions),
		conns:     make(map[ConnID]*conn),
		remote:    make(map[remoteKey]*conn),

		halfOpenByPeer: make(map[netip.Addr]int),
	}
}

// Drain returns the events and MADs produced since the last Drain, in the
// order produced. Act on all events before transmitting the MADs: an
// EventEstablished on the active side must have the QP in RTR before the
// RTU that follows it leaves. The slices stay valid until the next Drain;
// calling other methods while walking them is allowed.
func (m *Manager) Drain() ([]Event, []Send) {
	ev, sd := m.events[m.cur], m.sends[m.cur]
	m.cur ^= 1
	m.events[m.cur] = m.events[m.cur][:0]
	m.sends[m.cur] = m.sends[m.cur][:0]
	return ev, sd
}

// Stats returns the Manager's counters.
func (m *Manager) Stats() Stats { return m.stats }

// State returns the state of a connection (StateIdle if unknown).
func (m *Manager) State(id ConnID) State {
	if c := m.conns[id]; c != nil {
		return c.state
	}
	return StateIdle
}

// Conns returns how many connections and SIDR transactions are alive,
// time-wait included.
func (m *Manager) Conns() int { return len(m.conns) }

// HalfOpen returns how many passive entries count against the half-open
// caps (Config.MaxHalfOpen): not established, not yet released.
func (m *Manager) HalfOpen() int { return m.halfOpen }

// Listen starts accepting REQs and SIDR_REQs for serviceID.
func (m *Manager) Listen(serviceID uint64, opts ListenOptions) error {
	if _, dup := m.listeners[serviceID]; dup {
		return ErrListening
	}
	m.listeners[serviceID] = opts
	return nil
}

// Unlisten stops accepting new requests for serviceID; existing connections
// are unaffected.
func (m *Manager) Unlisten(serviceID uint64) error {
	if _, ok := m.listeners[serviceID]; !ok {
		return ErrNotListening
	}
	delete(m.listeners, serviceID)
	return nil
}

// NextDeadline returns the earliest timer of any connection, or
// clock.Never. The caller calls Tick when it passes.
func (m *Manager) NextDeadline() clock.Time {
	d := clock.Never
	for _, c := range m.conns {
		d = clock.Min(d, c.deadline)
	}
	return d
}

func (m *Manager) event(e *Event) { m.events[m.cur] = append(m.events[m.cur], *e) }

func (m *Manager) send(to netip.Addr, mad *[MADSize]byte) {
	m.sends[m.cur] = append(m.sends[m.cur], Send{To: to, MAD: *mad})
	if a := MAD(mad[:]).AttrID(); a >= AttrREQ && a < AttrREQ+16 {
		m.stats.Tx[a-AttrREQ]++
	}
}

// newID picks an unused, non-zero local comm ID: random, so that a
// restarted peer's stale MADs do not match, and never one still in
// time-wait.
func (m *Manager) newID() ConnID {
	for {
		id := ConnID(m.rng.Uint32())
		if id != 0 && m.conns[id] == nil {
			return id
		}
	}
}

func (m *Manager) newConn(active bool, peer netip.Addr) *conn {
	c := &conn{id: m.newID(), active: active, peer: peer, deadline: clock.Never}
	c.tid = m.tidHigh | uint64(c.id)
	m.conns[c.id] = c
	if !active {
		// Every passive entry is a peer's doing: it counts until it is
		// established or released. Callers check admit first.
		c.halfOpen = true
		m.halfOpen++
		m.halfOpenByPeer[peer]++
	}
	return c
}

// admit reports whether a new passive entry for peer fits under the
// half-open caps, counting a refusal.
func (m *Manager) admit(peer netip.Addr) bool {
	if m.halfOpen < m.cfg.MaxHalfOpen && m.halfOpenByPeer[peer] < m.cfg.MaxHalfOpenPerPeer {
		return true
	}
	m.stats.HalfOpenDropped++
	return false
}

// settleHalfOpen stops counting c against the half-open caps.
func (m *Manager) settleHalfOpen(c *conn) {
	if !c.halfOpen {
		return
	}
	c.halfOpen = false
	m.halfOpen--
	if n := m.halfOpenByPeer[c.peer] - 1; n > 0 {
		m.halfOpenByPeer[c.peer] = n
	} else {
		delete(m.halfOpenByPeer, c.peer)
	}
}

func (m *Manager) index(c *conn, k remoteKey) {
	c.remoteKey, c.indexed = k, true
	m.remote[k] = c
}

func (m *Manager) remove(c *conn) {
	if c.indexed && m.remote[c.remoteKey] == c {
		delete(m.remote, c.remoteKey)
	}
	delete(m.conns, c.id)
	m.settleHalfOpen(c)
	c.state = StateIdle
}

// respTimeout is how long to wait for an answer from a peer that takes up
// to 4.096 µs × 2^respT to respond: its response time plus a round trip.
func (m *Manager) respTimeout(respT uint8) time.Duration {
	return Timeout(respT) + 2*Timeout(m.cfg.PacketLifeTime)
}

// arm starts the retransmission timer of c's request in c.msg.
func (c *conn) arm(now clock.Time, timeout time.Duration, maxRetries uint8) {
	c.timeout, c.retries, c.maxRetries = timeout, 0, maxRetries
	c.deadline = now.Add(timeout)
}

// enterTimeWait holds the comm ID for one local ACK timeout of the
// connection's QP, after which no packet of the old connection can still be
// in flight, plus a packet life time for the last MADs.
func (m *Manager) enterTimeWait(now clock.Time, c *conn) {
	c.state = StateTimeWait
	t := c.qp.Timeout
	if c.halfOpen {
		// Never established: the peer's REQ chose t, and no RC packet
		// of ours ever left the QP.
		t = min(t, MaxPeerTimeout)
	}
	if t == 0 {
		t = ackTimeout(m.cfg.TargetACKDelay, m.cfg.PacketLifeTime)
	}
	c.deadline = now.Add(Timeout(t) + Timeout(m.cfg.PacketLifeTime))
}

func setPrivate(e *Event, p []byte) {
	e.PrivateDataLen = copy(e.PrivateData[:], p)
}

// Connect starts an active connection: it sends a REQ and returns the
// connection's ID. The QP must be in INIT; EventEstablished (or
// EventRejected / EventTimeout) follows.
func (m *Manager) Connect(now clock.Time, p *ConnectParams) (ConnID, error) {
	if !p.Peer.IsValid() || p.QPN == 0 || p.QPN > 0xFFFFFF || p.PathMTU < 1 || p.PathMTU > 5 {
		return 0, ErrBadParams
	}
	var req REQ
	if p.RDMACM {
		if len(p.PrivateData) > CMAUserSize {
			return 0, ErrPrivateTooBig
		}
		h := CMAHeader{SrcPort: p.SrcPort, Src: p.Local, Dst: p.Peer}
		if err := EncodeCMAHeader(req.PrivateData[:], &h); err != nil {
			return 0, err
		}
		copy(req.PrivateData[CMAHeaderSize:], p.PrivateData)
	} else {
		if len(p.PrivateData) > REQPrivateSize {
			return 0, ErrPrivateTooBig
		}
		copy(req.PrivateData[:], p.PrivateData)
	}
	ackT := p.LocalACKTimeout
	if ackT == 0 {
		ackT = ackTimeout(m.cfg.TargetACKDelay, m.cfg.PacketLifeTime)
	}
	hop := p.HopLimit
	if hop == 0 {
		hop = DefaultHopLimit
	}
	c := m.newConn(true, p.Peer.Unmap())
	c.serviceID = p.ServiceID
	c.state = StateREQSent
	c.deferRTU = p.DeferRTU
	c.qp = QPAttr{QPN: p.QPN, RQPSN: p.StartingPSN & 0xFFFFFF, PathMTU: p.PathMTU,
		MaxDestRdAtomic: p.ResponderResources, Timeout: ackT,
		RetryCount: min(p.RetryCount, 7), PKey: defaultPKey, Peer: c.peer,
		FlowLabel: p.FlowLabel & 0xFFFFF, TrafficClass: p.TrafficClass, HopLimit: hop}
	req.LocalCommID = uint32(c.id)
	req.ServiceID = p.ServiceID
	req.LocalCAGUID = m.cfg.CAGUID
	req.LocalQPN = p.QPN
	req.ResponderResources = p.ResponderResources
	req.InitiatorDepth = p.InitiatorDepth
	req.RemoteCMResponseTimeout = m.cfg.CMResponseTimeout
	req.TransportServiceType = TransportRC
	req.StartingPSN = p.StartingPSN & 0xFFFFFF
	req.LocalCMResponseTimeout = m.cfg.CMResponseTimeout
	req.RetryCount = min(p.RetryCount, 7)
	req.PKey = defaultPKey
	req.PathMTU = p.PathMTU
	req.RNRRetryCount = min(p.RNRRetry, 7)
	req.MaxCMRetries = m.cfg.MaxCMRetries
	req.Primary = Path{LocalLID: permissiveLID, RemoteLID: permissiveLID,
		LocalGID: GIDFromAddr(p.Local), RemoteGID: GIDFromAddr(p.Peer),
		FlowLabel: p.FlowLabel & 0xFFFFF, TrafficClass: p.TrafficClass, HopLimit: hop,
		LocalACKTimeout: ackT}
	// Remember what the passive side's initiator depth may be at most.
	c.qp.MaxRdAtomic = p.InitiatorDepth
	mad := MAD(c.msg[:])
	mad.InitCM(AttrREQ, c.tid)
	req.Encode(mad.Data())
	c.peerTimeout = m.respTimeout(m.cfg.CMResponseTimeout)
	c.arm(now, c.peerTimeout, m.cfg.MaxCMRetries)
	m.send(c.peer, &c.msg)
	return c.id, nil
}

// Accept answers an EventConnRequest with a REP. The QP must already be in
// RTR (programmed from the event's QP plus its own QPN, and RQPSN equal to
// p.StartingPSN): the active side may send from the REP's Starting PSN as
// soon as it has the REP.
func (m *Manager) Accept(now clock.Time, id ConnID, p *AcceptParams) error {
	c := m.conns[id]
	if c == nil {
		return ErrNoConn
	}
	if c.state != StateREQRcvd && c.state != StateMRAREQSent {
		return ErrBadState
	}
	if len(p.PrivateData) > REPPrivateSize {
		return ErrPrivateTooBig
	}
	if p.QPN == 0 || p.QPN > 0xFFFFFF {
		return ErrBadParams
	}
	c.qp.QPN = p.QPN
	c.qp.RQPSN = p.StartingPSN & 0xFFFFFF
	// c.qp.MaxDestRdAtomic / MaxRdAtomic hold the REQ's initiator depth and
	// responder resources: our limits are bounded by them.
	c.qp.MaxDestRdAtomic = min(p.ResponderResources, c.qp.MaxDestRdAtomic)
	c.qp.MaxRdAtomic = min(p.InitiatorDepth, c.qp.MaxRdAtomic)
	rep := REP{
		LocalCommID: uint32(c.id), RemoteCommID: c.remoteID,
		LocalQPN: p.QPN, StartingPSN: c.qp.RQPSN,
		ResponderResources: c.qp.MaxDestRdAtomic, InitiatorDepth: c.qp.MaxRdAtomic,
		TargetACKDelay: m.cfg.TargetACKDelay, RNRRetryCount: min(p.RNRRetry, 7),
		SRQ: p.SRQ, LocalCAGUID: m.cfg.CAGUID,
	}
	copy(rep.PrivateData[:], p.PrivateData)
	mad := MAD(c.msg[:])
	mad.InitCM(AttrREP, c.tid)
	rep.Encode(mad.Data())
	c.state = StateREPSent
	c.arm(now, c.peerTimeout, c.maxRetries)
	m.send(c.peer, &c.msg)
	return nil
}

// Reject refuses an EventConnRequest, or the REP of an EventConnResponse,
// with a REJ.
func (m *Manager) Reject(now clock.Time, id ConnID, reason RejectReason, private []byte) error {
	c := m.conns[id]
	if c == nil {
		return ErrNoConn
	}
	if len(private) > REJPrivateSize {
		return ErrPrivateTooBig
	}
	switch c.state {
	case StateREQRcvd, StateMRAREQSent:
		m.rejectREQ(c, reason, private)
	case StateREPRcvd:
		m.sendREJ(c.peer, c.tid, uint32(c.id), c.remoteID, MsgREP, reason, private)
		m.enterTimeWait(now, c)
	default:
		return ErrBadState
	}
	return nil
}

// rejectREQ refuses the peer's REQ held in c and keeps c, with the REJ,
// until the peer's REQ retries are over (c's deadline from handleREQ), so
// that a duplicate REQ (our REJ lost) gets the same answer instead of
// reaching the application again.
func (m *Manager) rejectREQ(c *conn, reason RejectReason, private []byte) {
	mad := MAD(c.msg[:])
	mad.InitCM(AttrREJ, c.tid)
	rej := REJ{LocalCommID: uint32(c.id), RemoteCommID: c.remoteID, MessageRejected: MsgREQ, Reason: reason}
	copy(rej.PrivateData[:], private)
	rej.Encode(mad.Data())
	c.state, c.rejected = StateTimeWait, true
	m.send(c.peer, &c.msg)
}

// SendMRA tells the active side of an EventConnRequest that the answer will
// take up to 4.096 µs × 2^serviceTimeout more, so that it stops resending
// its REQ meanwhile.
func (m *Manager) SendMRA(now clock.Time, id ConnID, serviceTimeout uint8) error {
	c := m.conns[id]
	if c == nil {
		return ErrNoConn
	}
	if c.state != StateREQRcvd && c.state != StateMRAREQSent {
		return ErrBadState
	}
	c.mraTimeout = min(serviceTimeout, 31)
	c.state = StateMRAREQSent
	// The active side now waits ServiceTimeout per try: so do we.
	c.deadline = now.Add(m.respTimeout(c.mraTimeout) * time.Duration(int(c.maxRetries)+1))
	m.sendMRA(c)
	return nil
}

func (m *Manager) sendMRA(c *conn) {
	var b [MADSize]byte
	mad := MAD(b[:])
	mad.InitCM(AttrMRA, c.tid)
	mra := MRA{LocalCommID: uint32(c.id), RemoteCommID: c.remoteID, MessageMRAed: MsgREQ, ServiceTimeout: c.mraTimeout}
	mra.Encode(mad.Data())
	m.send(c.peer, &b)
}

// Establish sends the RTU of an EventConnResponse (ConnectParams.DeferRTU):
// the QP is in RTS and the connection is established.
func (m *Manager) Establish(now clock.Time, id ConnID) error {
	c := m.conns[id]
	if c == nil {
		return ErrNoConn
	}
	if c.state != StateREPRcvd {
		return ErrBadState
	}
	c.state = StateEstablished
	m.sendRTU(c)
	return nil
}

// NotifyEstablished tells the passive side that its QP received a packet
// in RTR before the RTU arrived (the RTU was lost): the connection is
// established, as IBA's communication-established event requires.
func (m *Manager) NotifyEstablished(now clock.Time, id ConnID) error {
	c := m.conns[id]
	if c == nil {
		return ErrNoConn
	}
	switch c.state {
	case StateEstablished:
		return nil
	case StateREPSent, StateMRAREPRcvd:
		m.establishPassive(c)
		return nil
	default:
		return ErrBadState
	}
}

// Disconnect sends a DREQ for an established connection.
// EventDisconnected follows when the DREP arrives or the DREQ times out.
func (m *Manager) Disconnect(now clock.Time, id ConnID, private []byte) error {
	c := m.conns[id]
	if c == nil {
		return ErrNoConn
	}
	if c.state != StateEstablished {
		return ErrBadState
	}
	if len(private) > DREQPrivateSize {
		return ErrPrivateTooBig
	}
	dreq := DREQ{LocalCommID: uint32(c.id), RemoteCommID: c.remoteID, RemoteQPN: c.qp.RemoteQPN}
	copy(dreq.PrivateData[:], private)
	mad := MAD(c.msg[:])
	mad.InitCM(AttrDREQ, c.tid)
	dreq.Encode(mad.Data())
	c.state = StateDREQSent
	c.arm(now, c.peerTimeout, m.cfg.MaxCMRetries)
	m.send(c.peer, &c.msg)
	return nil
}

// Abort ends a connection in whatever state it is, as rdma_destroy_id does,
// telling the peer: a connection being set up is rejected (REJ timeout for
// our own REQ, consumer defined for the peer's), an established one gets a
// DREQ (and runs its course to time-wait); one already disconnecting or in
// time-wait is left to finish. It reports no event for the connection
// except what the peer's answers bring later.
func (m *Manager) Abort(now clock.Time, id ConnID) error {
	c := m.conns[id]
	if c == nil {
		return ErrNoConn
	}
	switch c.state {
	case StateREQSent, StateMRAREQRcvd:
		m.sendREJ(c.peer, c.tid, uint32(c.id), c.remoteID, MsgREQ, RejTimeout, nil)
		m.enterTimeWait(now, c)
	case StateREQRcvd, StateMRAREQSent:
		m.rejectREQ(c, RejConsumerDefined, nil)
	case StateREPSent, StateMRAREPRcvd, StateREPRcvd:
		m.sendREJ(c.peer, c.tid, uint32(c.id), c.remoteID, MsgREP, RejConsumerDefined, nil)
		m.enterTimeWait(now, c)
	case StateEstablished:
		return m.Disconnect(now, id, nil)
	case StateSIDRREQSent, StateSIDRREQRcvd:
		m.remove(c)
	default:
		// Disconnecting, in time-wait or done with a SIDR_REP: left to
		// finish.
	}
	return nil
}

func (m *Manager) sendREJ(to netip.Addr, tid uint64, local, remote uint32, msg uint8, reason RejectReason, private []byte) {
	var b [MADSize]byte
	mad := MAD(b[:])
	mad.InitCM(AttrREJ, tid)
	rej := REJ{LocalCommID: local, RemoteCommID: remote, MessageRejected: msg, Reason: reason}
	if reason == RejTimeout {
		// The ARI of a timeout REJ is the sender's CA GUID: with it the
		// peer finds a connection whose comm ID we never learnt.
		binary.BigEndian.PutUint64(rej.ARI[:], m.cfg.CAGUID)
		rej.RejectedInfoLength = 8
	}
	copy(rej.PrivateData[:], private)
	rej.Encode(mad.Data())
	m.send(to, &b)
}

func (m *Manager) sendRTU(c *conn) {
	var b [MADSize]byte
	mad := MAD(b[:])
	mad.InitCM(AttrRTU, c.tid)
	rtu := RTU{LocalCommID: uint32(c.id), RemoteCommID: c.remoteID}
	rtu.Encode(mad.Data())
	m.send(c.peer, &b)
}

func (m *Manager) sendDREP(to netip.Addr, tid uint64, local, remote uint32) {
	var b [MADSize]byte
	mad := MAD(b[:])
	mad.InitCM(AttrDREP, tid)
	drep := DREP{LocalCommID: local, RemoteCommID: remote}
	drep.Encode(mad.Data())
	m.send(to, &b)
}

// Tick runs every timer that has expired by now: retransmissions, their
// give-up, and the end of time-wait.
func (m *Manager) Tick(now clock.Time) {
	// Expired timers run in comm-ID order, so that a run is reproducible
	// (map order is not).
	m.expired = m.expired[:0]
	for id, c := range m.conns {
		if c.deadline <= now {
			m.expired = append(m.expired, id)
		}
	}
	slices.Sort(m.expired)
	for _, id := range m.expired {
		c := m.conns[id]
		if c == nil {
			continue
		}
		c.deadline = clock.Never
		switch c.state {
		case StateREQSent, StateMRAREQRcvd, StateREPSent, StateMRAREPRcvd, StateDREQSent, StateSIDRREQSent:
			if c.retries < c.maxRetries {
				c.retries++
				m.stats.Retransmits++
				c.deadline = now.Add(c.timeout)
				m.send(c.peer, &c.msg)
				continue
			}
			m.giveUp(now, c)
		case StateREQRcvd, StateMRAREQSent, StateSIDRREQRcvd:
			// The application never answered and the active side has
			// given up by now.
			if c.state != StateSIDRREQRcvd {
				m.sendREJ(c.peer, c.tid, uint32(c.id), c.remoteID, MsgREQ, RejTimeout, nil)
			}
			m.stats.Timeouts++
			e := Event{Kind: EventTimeout, ID: c.id, Peer: c.peer, ServiceID: c.serviceID, QP: c.qp}
			m.event(&e)
			m.remove(c)
		case StateTimeWait, StateSIDRREPSent:
			e := Event{Kind: EventTimeWaitExit, ID: c.id, Peer: c.peer, ServiceID: c.serviceID, QP: c.qp}
			if c.state == StateTimeWait && !c.rejected { // a rejected request never had a QP
				m.event(&e)
			}
			m.remove(c)
		default:
			// An established connection arms no timer.
		}
	}
}

// giveUp ends a request that was never answered.
func (m *Manager) giveUp(now clock.Time, c *conn) {
	m.stats.Timeouts++
	e := Event{ID: c.id, Peer: c.peer, ServiceID: c.serviceID, QP: c.qp}
	switch c.state {
	case StateREQSent, StateMRAREQRcvd:
		m.sendREJ(c.peer, c.tid, uint32(c.id), 0, MsgREQ, RejTimeout, nil)
		e.Kind = EventTimeout
		m.event(&e)
		m.enterTimeWait(now, c)
	case StateREPSent, StateMRAREPRcvd:
		m.sendREJ(c.peer, c.tid, uint32(c.id), c.remoteID, MsgREP, RejTimeout, nil)
		e.Kind = EventTimeout
		m.event(&e)
		m.enterTimeWait(now, c)
	case StateDREQSent:
		e.Kind, e.TimedOut = EventDisconnected, true
		m.event(&e)
		m.enterTimeWait(now, c)
	case StateSIDRREQSent:
		e.Kind = EventSIDRTimeout
		m.event(&e)
		m.remove(c)
	default:
		// Only the states that wait for an answer time out (Tick).
	}
}

// HandleMAD processes one MAD received on QP1 from the peer at from (the
// source IP of the packet; responses go back there). A malformed MAD is
// counted and refused with an error; it never panics.
func (m *Manager) HandleMAD(now clock.Time, from netip.Addr, b []byte) error {
	if !from.IsValid() {
		return ErrBadParams // no address to answer to
	}
	mad, err := ParseMAD(b)
	if err != nil {
		m.stats.Malformed++
		return err
	}
	from = from.Unmap()
	attr := mad.AttrID()
	if attr >= AttrREQ && attr < AttrREQ+16 {
		m.stats.Rx[attr-AttrREQ]++
	}
	switch attr {
	case AttrREQ:
		m.handleREQ(now, from, mad)
	case AttrREP:
		m.handleREP(from, mad)
	case AttrRTU:
		m.handleRTU(from, mad)
	case AttrREJ:
		m.handleREJ(now, from, mad)
	case AttrMRA:
		m.handleMRA(now, from, mad)
	case AttrDREQ:
		m.handleDREQ(now, from, mad)
	case AttrDREP:
		m.handleDREP(now, from, mad)
	case AttrSIDRREQ:
		if m.admitSIDR(from, mad) {
			m.handleSIDRREQ(now, from, mad)
		}
	case AttrSIDRREP:
		m.handleSIDRREP(from, mad)
	default:
		m.stats.Unsupported++
	}
	return nil
}

// admitSIDR reports whether a SIDR_REQ may reach handleSIDRREQ: a
// duplicate (answered from its entry) always may, a new one only under
// the half-open caps, as every new SIDR_REQ creates an entry.
func (m *Manager) admitSIDR(from netip.Addr, mad MAD) bool {
	id := binary.BigEndian.Uint32(mad.Data()) // SIDR_REQ's Request ID
	if m.remote[remoteKey{peer: from, id: id}] != nil {
		return true
	}
	return m.admit(from)
}

func (m *Manager) handleREQ(now clock.Time, from netip.Addr, mad MAD) {
	var req REQ
	req.Decode(mad.Data())
	key := remoteKey{peer: from, guid: req.LocalCAGUID, id: req.LocalCommID}
	if c := m.remote[key]; c != nil {
		// A duplicate: the active side has not heard our answer yet.
		m.stats.Duplicates++
		switch c.state {
		case StateREPSent, StateMRAREPRcvd:
			m.send(c.peer, &c.msg) // our REP again
		case StateMRAREQSent:
			m.sendMRA(c)
		case StateTimeWait:
			if c.rejected {
				m.send(c.peer, &c.msg)
				break
			}
			m.sendREJ(from, mad.TID(), uint32(c.id), req.LocalCommID, MsgREQ, RejStaleConn, nil)
		default:
			// Not answered yet, or past the REP: dropped, as the Linux
			// CM drops it.
		}
		return
	}
	opts, ok := m.listeners[req.ServiceID]
	if !ok {
		m.stats.NoListener++
		m.sendREJ(from, mad.TID(), 0, req.LocalCommID, MsgREQ, RejInvalidServiceID, nil)
		return
	}
	// A new REQ for a listener costs an entry. Beyond the half-open caps
	// it is dropped, not rejected: a legitimate peer's retry gets in once
	// entries are released, and a spoofed flood draws no answers towards
	// the address it forged. Checked before the checks below, so that a
	// flood at the cap costs no scan of the connections.
	if !m.admit(from) {
		return
	}
	if m.staleQP(from, req.LocalCAGUID, req.LocalQPN) {
		// The peer's QP is still part of a live connection here: the peer
		// restarted or lost the connection without a DREQ. Refuse, as the
		// kernel CM does, until the old connection is torn down.
		m.sendREJ(from, mad.TID(), 0, req.LocalCommID, MsgREQ, RejStaleConn, nil)
		return
	}
	if req.TransportServiceType != TransportRC {
		m.sendREJ(from, mad.TID(), 0, req.LocalCommID, MsgREQ, RejInvalidTransportType, nil)
		return
	}
	if req.PathMTU < 1 || req.PathMTU > 5 {
		m.sendREJ(from, mad.TID(), 0, req.LocalCommID, MsgREQ, RejInvalidMTU, nil)
		return
	}
	e := Event{Kind: EventConnRequest, Peer: from, ServiceID: req.ServiceID}
	private := req.PrivateData[:]
	if opts.RDMACM {
		h, err := DecodeCMAHeader(private)
		if err != nil || (opts.Addr.IsValid() && h.Dst != opts.Addr.Unmap()) {
			m.sendREJ(from, mad.TID(), 0, req.LocalCommID, MsgREQ, RejConsumerDefined, nil)
			return
		}
		e.CMA, e.HasCMA = h, true
		private = private[CMAHeaderSize:]
	}
	c := m.newConn(false, from)
	c.state = StateREQRcvd
	c.serviceID = req.ServiceID
	c.tid = mad.TID() // the whole exchange keeps the active side's TID
	c.remoteID = req.LocalCommID
	c.guid = req.LocalCAGUID
	c.maxRetries = req.MaxCMRetries
	c.peerTimeout = m.respTimeout(min(req.LocalCMResponseTimeout, MaxPeerTimeout))
	m.index(c, key)
	// MaxDestRdAtomic/MaxRdAtomic hold the bounds the REQ sets on ours
	// until Accept picks the values.
	c.qp = QPAttr{RemoteQPN: req.LocalQPN, SQPSN: req.StartingPSN, PathMTU: req.PathMTU,
		MaxDestRdAtomic: req.InitiatorDepth, MaxRdAtomic: req.ResponderResources,
		Timeout: req.Primary.LocalACKTimeout, RetryCount: req.RetryCount, RNRRetry: req.RNRRetryCount,
		PKey: req.PKey, Peer: from, FlowLabel: req.Primary.FlowLabel,
		TrafficClass: req.Primary.TrafficClass, HopLimit: req.Primary.HopLimit}
	// Give up on the application once the active side has given up: its
	// REQ timeout (our response time plus a round trip) times its tries.
	c.deadline = now.Add(m.respTimeout(min(req.RemoteCMResponseTimeout, MaxPeerTimeout)) * time.Duration(int(req.MaxCMRetries)+1))
	e.ID, e.QP = c.id, c.qp
	setPrivate(&e, private)
	m.event(&e)
}

// staleQP reports whether a live (not yet time-wait) passive connection
// already has the peer QP guid/qpn at from. A scan: CM traffic is rare and
// connections few, and it keeps no second index to maintain.
func (m *Manager) staleQP(from netip.Addr, guid uint64, qpn uint32) bool {
	for _, c := range m.conns {
		if !c.active && c.peer == from && c.guid == guid && c.qp.RemoteQPN == qpn {
			switch c.state {
			case StateREPSent, StateMRAREPRcvd, StateEstablished, StateDREQSent:
				return true
			default:
				// Not yet accepted, or in time-wait: not stale.
			}
		}
	}
	return false
}

// ackTimeout combines the peer's target ACK delay with the round trip of
// the path: 4.096 µs × 2^t for the sum of 2^delay and 2 × 2^life. Adding 1
// to an exponent doubles the time, so the larger term decides and gains
// one when the other is within a factor two of it.
func ackTimeout(targetACKDelay, packetLifeTime uint8) uint8 {
	rt := int(packetLifeTime) + 1 // 2 × life time
	d := int(targetACKDelay)
	t := max(rt, d)
	if lo := min(rt, d); lo >= t-1 {
		t++
	}
	return uint8(min(t, 31))
}

func (m *Manager) handleREP(from netip.Addr, mad MAD) {
	var rep REP
	rep.Decode(mad.Data())
	c := m.conns[ConnID(rep.RemoteCommID)]
	if c == nil || !c.active || c.peer != from {
		m.stats.Unmatched++
		m.sendREJ(from, mad.TID(), 0, rep.LocalCommID, MsgREP, RejInvalidCommID, nil)
		return
	}
	switch c.state {
	case StateREQSent, StateMRAREQRcvd:
	case StateEstablished, StateREPRcvd:
		if rep.LocalCommID == c.remoteID {
			m.stats.Duplicates++
			if c.state == StateEstablished {
				m.sendRTU(c) // our RTU was lost
			}
			return
		}
		m.stats.Unmatched++
		return
	default:
		m.stats.Unmatched++
		return
	}
	c.remoteID = rep.LocalCommID
	c.guid = rep.LocalCAGUID
	c.qp.RemoteQPN = rep.LocalQPN
	c.qp.SQPSN = rep.StartingPSN
	c.qp.RNRRetry = rep.RNRRetryCount
	// What the passive side accepts bounds what we may issue, and what it
	// will issue is what our responder must hold.
	c.qp.MaxRdAtomic = min(c.qp.MaxRdAtomic, rep.ResponderResources)
	c.qp.MaxDestRdAtomic = rep.InitiatorDepth
	c.qp.Timeout = ackTimeout(rep.TargetACKDelay, m.cfg.PacketLifeTime)
	c.deadline = clock.Never
	e := Event{Kind: EventEstablished, ID: c.id, Peer: c.peer, ServiceID: c.serviceID, QP: c.qp}
	setPrivate(&e, rep.PrivateData[:])
	if c.deferRTU {
		// The owner moves its QP, then calls Establish. Nothing to retry
		// meanwhile: the passive side resends its REP until the RTU
		// comes, and gives up with a REJ if it never does.
		c.state = StateREPRcvd
		e.Kind = EventConnResponse
		m.event(&e)
		return
	}
	c.state = StateEstablished
	m.event(&e)
	m.sendRTU(c)
}

func (m *Manager) establishPassive(c *conn) {
	m.settleHalfOpen(c)
	c.state = StateEstablished
	c.deadline = clock.Never
	e := Event{Kind: EventEstablished, ID: c.id, Peer: c.peer, ServiceID: c.serviceID, QP: c.qp}
	m.event(&e)
}

// lookup finds the connection a MAD addressed to our comm ID local belongs
// to. It must come from the connection's peer and, once we know it, carry
// the peer's comm ID: a third host cannot tear down or hijack a
// connection by guessing IDs.
func (m *Manager) lookup(from netip.Addr, local, remote uint32) *conn {
	c := m.conns[ConnID(local)]
	if c == nil || c.peer != from || (c.remoteID != 0 && c.remoteID != remote) {
		return nil
	}
	return c
}

func (m *Manager) handleRTU(from netip.Addr, mad MAD) {
	var rtu RTU
	rtu.Decode(mad.Data())
	c := m.lookup(from, rtu.RemoteCommID, rtu.LocalCommID)
	if c == nil || c.active {
		m.stats.Unmatched++
		return
	}
	switch c.state {
	case StateREPSent, StateMRAREPRcvd:
		m.establishPassive(c)
		m.attachPrivate(c, rtu.PrivateData[:])
	case StateEstablished:
		m.stats.Duplicates++
	default:
		m.stats.Unmatched++
	}
}

// attachPrivate attaches the RTU's private data to the EventEstablished
// just queued for c.
func (m *Manager) attachPrivate(c *conn, p []byte) {
	ev := m.events[m.cur]
	if n := len(ev); n > 0 && ev[n-1].ID == c.id && ev[n-1].Kind == EventEstablished {
		setPrivate(&ev[n-1], p)
	}
}

func (m *Manager) handleREJ(now clock.Time, from netip.Addr, mad MAD) {
	var rej REJ
	rej.Decode(mad.Data())
	c := m.conns[ConnID(rej.RemoteCommID)]
	if c == nil && rej.RemoteCommID == 0 && rej.Reason == RejTimeout && rej.RejectedInfoLength >= 8 {
		// The active side gave up on a REQ before learning our comm ID.
		c = m.remote[remoteKey{peer: from, guid: binary.BigEndian.Uint64(rej.ARI[:]), id: rej.LocalCommID}]
	}
	if c == nil || c.peer != from || (c.remoteID != 0 && rej.LocalCommID != 0 && c.remoteID != rej.LocalCommID) {
		m.stats.Unmatched++
		return
	}
	switch c.state {
	case StateREQSent, StateMRAREQRcvd, StateREQRcvd, StateMRAREQSent, StateREPSent, StateMRAREPRcvd, StateREPRcvd, StateEstablished:
	default:
		m.stats.Unmatched++
		return
	}
	e := Event{Kind: EventRejected, ID: c.id, Peer: c.peer, ServiceID: c.serviceID, QP: c.qp, Reason: rej.Reason}
	setPrivate(&e, rej.PrivateData[:])
	m.event(&e)
	if rej.Reason == RejTimeout || rej.Reason == RejStaleConn || c.state == StateEstablished {
		m.enterTimeWait(now, c)
		return
	}
	m.remove(c)
}

func (m *Manager) handleMRA(now clock.Time, from netip.Addr, mad MAD) {
	var mra MRA
	mra.Decode(mad.Data())
	c := m.lookup(from, mra.RemoteCommID, mra.LocalCommID)
	if c == nil {
		m.stats.Unmatched++
		return
	}
	switch {
	case mra.MessageMRAed == MsgREQ && (c.state == StateREQSent || c.state == StateMRAREQRcvd):
		c.state = StateMRAREQRcvd
	case mra.MessageMRAed == MsgREP && (c.state == StateREPSent || c.state == StateMRAREPRcvd):
		c.state = StateMRAREPRcvd
	default:
		m.stats.Unmatched++
		return
	}
	if c.remoteID == 0 {
		c.remoteID = mra.LocalCommID
	}
	// The peer needs its service time plus a round trip; keep retrying at
	// that pace, so a peer that dies after its MRA is still detected.
	st := mra.ServiceTimeout
	if c.halfOpen {
		st = min(st, MaxPeerTimeout) // an MRA of our REP must not pin the slot
	}
	c.timeout = Timeout(st) + 2*Timeout(m.cfg.PacketLifeTime)
	c.deadline = now.Add(c.timeout)
}

func (m *Manager) handleDREQ(now clock.Time, from netip.Addr, mad MAD) {
	var dreq DREQ
	dreq.Decode(mad.Data())
	c := m.lookup(from, dreq.RemoteCommID, dreq.LocalCommID)
	if c == nil {
		// Unknown (or long gone): answer anyway so that the peer stops
		// retrying, as the kernel CM does.
		m.stats.Unmatched++
		m.sendDREP(from, mad.TID(), dreq.RemoteCommID, dreq.LocalCommID)
		return
	}
	switch c.state {
	case StateEstablished, StateREPSent, StateMRAREPRcvd, StateDREQSent:
		// REP_SENT: our RTU never came but the peer is done anyway; a
		// DREQ crossing ours is answered like any other.
		if dreq.RemoteQPN != c.qp.QPN {
			m.stats.Unmatched++
			return
		}
		m.sendDREP(c.peer, mad.TID(), uint32(c.id), c.remoteID)
		e := Event{Kind: EventDisconnectRequest, ID: c.id, Peer: c.peer, ServiceID: c.serviceID, QP: c.qp}
		setPrivate(&e, dreq.PrivateData[:])
		m.event(&e)
		m.enterTimeWait(now, c)
	case StateTimeWait:
		m.stats.Duplicates++ // our DREP was lost
		m.sendDREP(c.peer, mad.TID(), uint32(c.id), c.remoteID)
	default:
		m.stats.Unmatched++
	}
}

func (m *Manager) handleDREP(now clock.Time, from netip.Addr, mad MAD) {
	var drep DREP
	drep.Decode(mad.Data())
	c := m.lookup(from, drep.RemoteCommID, drep.LocalCommID)
	if c == nil || c.state != StateDREQSent {
		m.stats.Unmatched++
		return
	}
	e := Event{Kind: EventDisconnected, ID: c.id, Peer: c.peer, ServiceID: c.serviceID, QP: c.qp}
	setPrivate(&e, drep.PrivateData[:])
	m.event(&e)
	m.enterTimeWait(now, c)
}
