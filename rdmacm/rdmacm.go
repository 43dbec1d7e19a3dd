package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// GRH bytes in front of every UD receive, as verbs delivers them.
const grhLen = 40

// Defaults.
const (
	DefaultRecvDepth = 64
	// DefaultMinRNRTimer is the RNR NAK delay our RC QPs ask for (IB enum
	// 12 = 0.64 ms), short enough for a ping-pong whose receives are
	// re-posted in a few microseconds.
	DefaultMinRNRTimer = 12
	resolveTimeout     = 3 * time.Second
	negativeCacheFor   = time.Second
	// mraServiceTimeout is the service timeout of our MRAs: 4.096 µs ×
	// 2^24 ≈ 69 s, the kernel's CMA_CM_MRA_SETTING.
	mraServiceTimeout = 24
)

// Config configures an Agent.
type Config struct {
	// Device is the RNIC port to run on: it reports asynchronous events
	// (verbs.AsyncEventer) and its CQs notify (verbs.Notifier). The agent
	// creates its GSI QP: the device must not have one.
	Device verbs.Device
	// Resolve returns the MAC frames to peer go to (the peer's own on its
	// subnet, a router's otherwise): the device's address resolution. It
	// may block; it is never called with the agent's lock held.
	Resolve func(ctx context.Context, peer netip.Addr) ([6]byte, error)
	// CM configures the Manager (timeouts, retries, CA GUID, seed). A
	// zero CAGUID is derived from the device's MAC as EUI-64, as rxe does.
	CM cm.Config
	// Now is the clock (clock.Now if nil).
	Now func() clock.Time
	// RecvDepth is how many MAD receives stay posted on QP1
	// (DefaultRecvDepth if 0).
	RecvDepth int
}

// Stats counts what the agent did besides the Manager's own Stats.
type Stats struct {
	RxMADs       uint64 // MADs handed to the Manager
	RxBad        uint64 // GSI receives that were not a 256-byte MAD or failed
	RxLost       uint64 // receive slots not posted again (the GSI QP in error)
	TxMADs       uint64 // MADs posted to QP1
	TxDropped    uint64 // MADs not posted: no MAC for the peer, or the send queue full
	TxErrors     uint64 // send completions with an error
	Unresolved   uint64 // peers whose MAC could not be resolved
	QPErrors     uint64 // RC QP transitions that failed (the connection was aborted)
	BacklogFull  uint64 // REQs refused because a listener's backlog was full
	MRAs         uint64 // REQs answered with an MRA because they wait behind others
	CommEstFixes uint64 // connections established by COMM_EST before their RTU
}

// Errors.
var (
	ErrClosed       = errors.New("rdmacm: agent closed")
	ErrListening    = errors.New("rdmacm: port already listened on")
	ErrNoLocalAddr  = errors.New("rdmacm: device has no address of the peer's family")
	ErrDisconnected = errors.New("rdmacm: connection disconnected")
)

// RejectedError is a Connect (or Accept) that the peer refused with a REJ.
type RejectedError struct {
	Reason      cm.RejectReason
	PrivateData []byte
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("rdmacm: connection rejected: %v (%d)", e.Reason, uint16(e.Reason))
}

// ErrTimeout is a Connect or Accept whose REQ or REP went unanswered through
// every CM retry.
var ErrTimeout = errors.New("rdmacm: connection timed out (no answer after MaxCMRetries)")

// Agent is the CM agent of one device.
type Agent struct {
	cfg  Config
	dev  verbs.Device
	pd   verbs.PD
	cq   verbs.CQ
	cqn  verbs.Notifier
	evs  <-chan verbs.AsyncEvent
	gsi  verbs.QP
	rmem verbs.Mem
	rbuf verbs.MR
	rwr  [1]verbs.RecvWR
	swr  [1]verbs.SendWR
	rng  *rand.Rand
	kick chan struct{}
	stop context.CancelFunc
	done chan struct{}
	pmtu int
	wc   [32]ib.WC
	mads []pendingMAD

	mu        sync.Mutex // guards everything below, and the Manager
	m         *cm.Manager
	closed    bool
	macs      map[netip.Addr][6]byte
	failed    map[netip.Addr]clock.Time // peers that did not resolve, until when not to retry
	ahs       map[netip.Addr]verbs.AH
	listeners map[uint16]*listener
	// udListeners and sidr are rdma_cm's UDP port space (ud.go).
	udListeners map[uint16]*udListener
	sidr        map[cm.ConnID]*sidrWait
	conns       map[cm.ConnID]*conn
	byQPN       map[uint32]*conn
	stats       Stats
	inflight    int      // MADs posted, their send completion not yet polled
	ev          *EventCM // the event interface, if started (events.go)
}

type pendingMAD struct {
	from netip.Addr
	slot uint64
}

// New creates the GSI QP on cfg.Device, posts its receives and starts the
// agent's goroutine. Close stops it.
func New(cfg Config) (*Agent, error) {
	if cfg.Device == nil || cfg.Resolve == nil {
		return nil, errors.New("rdmacm: Config needs a Device and a Resolve function")
	}
	if cfg.Now == nil {
		cfg.Now = clock.Now
	}
	if cfg.RecvDepth <= 0 {
		cfg.RecvDepth = DefaultRecvDepth
	}
	ev, ok := cfg.Device.(verbs.AsyncEventer)
	if !ok {
		return nil, errors.New("rdmacm: the device reports no asynchronous events")
	}
	attr := cfg.Device.Query()
	if cfg.CM.CAGUID == 0 {
		cfg.CM.CAGUID = attr.NodeGUID
	}
	if cfg.CM.Seed == 0 {
		cfg.CM.Seed = rand.Uint64()
	}
	a := &Agent{cfg: cfg, dev: cfg.Device, pmtu: int(attr.ActiveMTU), evs: ev.Events(),
		rng:  rand.New(rand.NewPCG(cfg.CM.Seed, cfg.CM.Seed^0x5eed)),
		kick: make(chan struct{}, 1), done: make(chan struct{}),
		m: cm.New(cfg.CM), macs: map[netip.Addr][6]byte{}, failed: map[netip.Addr]clock.Time{}, ahs: map[netip.Addr]verbs.AH{},
		listeners: map[uint16]*listener{}, udListeners: map[uint16]*udListener{}, sidr: map[cm.ConnID]*sidrWait{},
		conns: map[cm.ConnID]*conn{}, byQPN: map[uint32]*conn{}}
	if err := a.setup(); err != nil {
		return nil, errors.Join(err, a.release())
	}
	ctx, stop := context.WithCancel(context.Background())
	a.stop = stop
	go a.run(ctx)
	return a, nil
}

// setup makes the agent's PD, CQ, GSI QP (in RTS) and receive buffer, and
// posts the receives. On failure release undoes what it made.
func (a *Agent) setup() error {
	var err error
	if a.pd, err = a.dev.AllocPD(); err != nil {
		return err
	}
	// Sends complete too (signaled, to learn of errors): room for both.
	if a.cq, err = a.dev.CreateCQ(a.cfg.RecvDepth + gsiSendDepth); err != nil {
		return err
	}
	var ok bool
	if a.cqn, ok = a.cq.(verbs.Notifier); !ok {
		return errors.New("rdmacm: the device's CQs do not notify")
	}
	a.gsi, err = a.pd.CreateQP(&verbs.QPInitAttr{Type: ib.GSI, SendCQ: a.cq, RecvCQ: a.cq,
		Cap: ib.QPCaps{MaxSendWR: gsiSendDepth, MaxRecvWR: uint32(a.cfg.RecvDepth), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: cm.MADSize}})
	if err != nil {
		return fmt.Errorf("rdmacm: GSI QP: %w", err)
	}
	for _, m := range []struct {
		attr ib.QPAttr
		mask ib.QPAttrMask
	}{
		{ib.QPAttr{State: ib.Init, QKey: bth.GSIQKey}, ib.AttrState | ib.AttrPKeyIndex | ib.AttrQKey},
		{ib.QPAttr{State: ib.RTR}, ib.AttrState},
		{ib.QPAttr{State: ib.RTS}, ib.AttrState | ib.AttrSQPSN},
	} {
		if err := a.gsi.Modify(&m.attr, m.mask); err != nil {
			return fmt.Errorf("rdmacm: GSI QP to %v: %w", m.attr.State, err)
		}
	}
	n := a.cfg.RecvDepth * (grhLen + cm.MADSize)
	if a.rmem, err = a.dev.AllocMem(n); err != nil {
		return err
	}
	if a.rbuf, err = a.pd.RegMR(a.rmem, 0, n, 0, ib.LocalWrite); err != nil {
		return err
	}
	for i := range a.cfg.RecvDepth {
		if err := a.postRecv(uint64(i)); err != nil {
			return err
		}
	}
	return nil
}

// release destroys what the agent made on its device, in dependency order:
// the GSI QP, the receive buffer's MR and memory, the address handles, the
// CQ, the PD. Objects not made yet are nil and skipped.
func (a *Agent) release() error {
	var errs []error
	if a.gsi != nil {
		errs = append(errs, a.gsi.Destroy())
	}
	if a.rbuf != nil {
		errs = append(errs, a.rbuf.Dereg())
	}
	if a.rmem != nil {
		errs = append(errs, a.rmem.Free())
	}
	for to, ah := range a.ahs {
		errs = append(errs, ah.Destroy())
		delete(a.ahs, to)
	}
	if a.cq != nil {
		errs = append(errs, a.cq.Destroy())
	}
	if a.pd != nil {
		errs = append(errs, a.pd.Dealloc())
	}
	return errors.Join(errs...)
}

// gsiSendDepth is how many MADs may be in flight on the GSI QP.
const gsiSendDepth = 256

// postRecv posts receive slot of the MAD buffer again (the agent's
// goroutine, or New before it starts).
func (a *Agent) postRecv(slot uint64) error {
	const n = grhLen + cm.MADSize
	a.rwr[0] = verbs.RecvWR{ID: slot, SG: []ib.SGE{{Addr: a.rbuf.IOVA() + slot*n, Length: n, LKey: a.rbuf.LKey()}}}
	_, err := a.gsi.PostRecv(a.rwr[:])
	return err
}

// repost posts receive slot again after its MAD was handled. A failure
// (the GSI QP in error) loses the slot, counted.
func (a *Agent) repost(slot uint64) {
	if err := a.postRecv(slot); err != nil {
		a.mu.Lock()
		a.stats.RxLost++
		a.mu.Unlock()
	}
}

// Close aborts every connection (REJ or DREQ to the peers, sent before the
// GSI QP goes), stops the agent's goroutine and releases what it made on
// the device (its QP, CQ, PD, receive buffer and address handles). RC QPs
// of connections are left to their owners.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	now := a.cfg.Now()
	for id := range a.conns {
		_ = a.m.Abort(now, id) // fails only for a connection already gone
	}
	if a.ev != nil {
		for id := range a.ev.conns {
			_ = a.m.Abort(now, id) // closing: every connection goes
		}
	}
	a.flushLocked(now)
	a.closed = true
	for _, c := range a.conns {
		c.finishLocked(ErrClosed)
	}
	for _, l := range a.listeners {
		l.closeLocked()
	}
	for _, l := range a.udListeners {
		l.closeLocked()
	}
	for id, w := range a.sidr {
		delete(a.sidr, id)
		w.result <- sidrResult{err: ErrClosed}
	}
	a.mu.Unlock()
	a.stop()
	<-a.done
	// Give the engine a moment to put the last MADs (the REJs and DREQs
	// just sent) on the wire before the QP they sit on goes away.
	for i := 0; i < 200 && a.inflight > 0; i++ {
		n := a.cq.Poll(a.wc[:])
		for _, wc := range a.wc[:n] {
			if !wc.IsRecv {
				a.inflight--
			}
		}
		if n == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return a.release()
}

// Device is the device the agent runs on.
func (a *Agent) Device() verbs.Device { return a.dev }

// Stats returns the agent's counters and its Manager's.
func (a *Agent) Stats() (Stats, cm.Stats) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats, a.m.Stats()
}

func (a *Agent) wake() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// run is the agent's goroutine.
func (a *Agent) run(ctx context.Context) {
	defer close(a.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		a.mu.Lock()
		dl := a.m.NextDeadline()
		a.mu.Unlock()
		wait := time.Hour
		if dl != clock.Never {
			wait = max(dl.Sub(a.cfg.Now()), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-a.cqn.Notify():
		case ev := <-a.evs:
			a.asyncEvent(ev)
		case <-timer.C:
		case <-a.kick:
		}
		a.poll(ctx)
		a.mu.Lock()
		now := a.cfg.Now()
		if a.m.NextDeadline() <= now {
			a.m.Tick(now)
		}
		a.flushLocked(now)
		a.mu.Unlock()
	}
}

// asyncEvent handles the device's asynchronous events: COMM_EST on a
// passive QP still waiting for its RTU establishes the connection, as IBA
// requires (the RTU was lost and the peer already sends).
func (a *Agent) asyncEvent(ev verbs.AsyncEvent) {
	if ev.Type != ib.EventCommEst {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.cfg.Now()
	if a.ev != nil && a.ev.commEstLocked(now, ev.QPN) {
		a.flushLocked(now)
		return
	}
	c := a.byQPN[ev.QPN]
	if c == nil || c.active {
		return
	}
	if a.m.State(c.id) == cm.StateREPSent || a.m.State(c.id) == cm.StateMRAREPRcvd {
		if a.m.NotifyEstablished(now, c.id) == nil {
			a.stats.CommEstFixes++
		}
	}
	a.flushLocked(now)
}

// poll takes the GSI CQ's completions: MADs go to the Manager once their
// sender's MAC is known, then their receive is posted again.
func (a *Agent) poll(ctx context.Context) {
	for {
		n := a.cq.Poll(a.wc[:])
		if n == 0 {
			return
		}
		a.mads = a.mads[:0]
		for _, wc := range a.wc[:n] {
			if !wc.IsRecv {
				a.mu.Lock()
				a.inflight--
				if wc.Status != ib.Success {
					a.stats.TxErrors++
				}
				a.mu.Unlock()
				continue
			}
			if wc.Status == ib.WRFlushErr {
				continue // the QP is going away
			}
			if wc.Status != ib.Success || wc.ByteLen != grhLen+cm.MADSize || wc.SrcQP != 1 || !wc.SrcIP.IsValid() {
				a.mu.Lock()
				a.stats.RxBad++
				a.mu.Unlock()
				a.repost(wc.ID)
				continue
			}
			a.mads = append(a.mads, pendingMAD{from: wc.SrcIP.Unmap(), slot: wc.ID})
		}
		for _, p := range a.mads {
			resolved := a.ensureMAC(ctx, p.from) == nil
			const sz = grhLen + cm.MADSize
			off := p.slot * sz
			mad := a.rmem.Bytes()[off+grhLen : off+sz]
			a.mu.Lock()
			if resolved {
				a.stats.RxMADs++
				now := a.cfg.Now()
				_ = a.m.HandleMAD(now, p.from, mad) // a malformed MAD is counted in the Manager's Stats
				a.flushLocked(now)
			}
			a.mu.Unlock()
			a.repost(p.slot)
		}
	}
}

// ensureMAC resolves peer's MAC unless it is cached. A peer that failed
// to resolve is not tried again for negativeCacheFor, so that MADs from a
// source that does not answer ARP (a spoofed one, say) cannot keep the
// agent's goroutine waiting.
func (a *Agent) ensureMAC(ctx context.Context, peer netip.Addr) error {
	a.mu.Lock()
	_, ok := a.macs[peer]
	until, bad := a.failed[peer]
	now := a.cfg.Now()
	a.mu.Unlock()
	if ok {
		return nil
	}
	if bad && now < until {
		return fmt.Errorf("rdmacm: %v did not resolve a moment ago", peer)
	}
	rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	mac, err := a.cfg.Resolve(rctx, peer)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.stats.Unresolved++
		if len(a.failed) > 1024 {
			clear(a.failed) // bounded: many failing sources only cost resolutions
		}
		a.failed[peer] = a.cfg.Now().Add(negativeCacheFor)
		return fmt.Errorf("rdmacm: resolve %v: %w", peer, err)
	}
	delete(a.failed, peer)
	a.macs[peer] = mac
	return nil
}

// sgid returns the GID index of the device's first address of peer's
// family: the source of our MADs and connections to peer.
func (a *Agent) sgid(peer netip.Addr) (int, netip.Addr, error) {
	return SourceGID(a.dev.GIDs(), peer)
}

// SourceGID picks the entry of a GID table that packets to peer leave
// from, as rdma_cm binds a connection: the first of peer's family (and,
// for IPv6, of its link-local scope if one is), and ErrNoLocalAddr if
// there is none.
func SourceGID(gids []netip.Addr, peer netip.Addr) (int, netip.Addr, error) {
	for i, ad := range gids {
		if ad.Is4() == peer.Is4() && (peer.Is4() || ad.IsLinkLocalUnicast() == peer.IsLinkLocalUnicast()) {
			return i, ad, nil
		}
	}
	for i, ad := range gids {
		if ad.Is4() == peer.Is4() {
			return i, ad, nil
		}
	}
	return 0, netip.Addr{}, ErrNoLocalAddr
}

// flushLocked acts on the Manager's events, then sends its MADs, until it
// has nothing more (acting on an event may produce MADs, e.g. a REJ).
func (a *Agent) flushLocked(now clock.Time) {
	for range 8 {
		evs, sends := a.m.Drain()
		if len(evs) == 0 && len(sends) == 0 {
			return
		}
		for i := range evs {
			a.eventLocked(now, &evs[i])
		}
		for i := range sends {
			a.sendLocked(&sends[i])
		}
	}
}

// sendLocked posts one MAD as a UD SEND to QP1 of its destination. The
// MAD is copied inline, so the Manager's buffer is free at once.
func (a *Agent) sendLocked(s *cm.Send) {
	to := s.To.Unmap()
	ah := a.ahs[to]
	if ah == nil {
		mac, ok := a.macs[to]
		idx, _, err := a.sgid(to)
		if !ok || err != nil {
			a.stats.TxDropped++
			return
		}
		ah, err = a.pd.CreateAH(&ib.AddressVector{DMAC: mac, DGID: ib.GIDFrom(to), SGIDIndex: uint8(idx), HopLimit: cm.DefaultHopLimit})
		if err != nil {
			a.stats.TxDropped++
			return
		}
		a.ahs[to] = ah
	}
	a.swr[0] = verbs.SendWR{Opcode: ib.Send, Flags: ib.Signaled | ib.Inline,
		InlineData: s.MAD[:], AH: ah, RemoteQPN: 1, RemoteQKey: bth.GSIQKey}
	_, err := a.gsi.PostSend(a.swr[:])
	if err != nil {
		a.stats.TxDropped++ // the CM's retransmission covers it
		return
	}
	a.stats.TxMADs++
	a.inflight++
}

// eventLocked does what a Manager event asks of the QP owner, or hands it
// to the event interface if the connection is one of its.
func (a *Agent) eventLocked(now clock.Time, e *cm.Event) {
	if a.ev != nil && a.ev.eventLocked(e) {
		return
	}
	switch e.Kind {
	case cm.EventConnRequest:
		_, port, _ := cm.ServicePort(e.ServiceID)
		l := a.listeners[port]
		if l == nil || l.closed {
			_ = a.m.Reject(now, e.ID, cm.RejInvalidServiceID, nil) // a request just reported: it cannot fail
			return
		}
		r := &request{agent: a, l: l, id: e.ID, peer: e.Peer, attr: e.QP, cma: e.CMA,
			private: append([]byte(nil), e.Private()...)}
		queued := len(l.backlog)
		select {
		case l.backlog <- r:
			if queued > 0 {
				// It waits behind others: tell the active side to stop
				// retrying for a while (MRA), as the kernel's rdma_cm
				// does for a request its application has not taken yet.
				_ = a.m.SendMRA(now, e.ID, mraServiceTimeout) // a request just reported: it cannot fail
				a.stats.MRAs++
			}
		default:
			a.stats.BacklogFull++
			_ = a.m.Reject(now, e.ID, cm.RejNoResources, nil) // a request just reported: it cannot fail
		}
	case cm.EventSIDRRequest:
		a.sidrRequestLocked(now, e)
	case cm.EventSIDRReply, cm.EventSIDRTimeout:
		a.sidrEventLocked(e)
	case cm.EventEstablished:
		c := a.conns[e.ID]
		if c == nil {
			return
		}
		if c.active {
			c.private = append([]byte(nil), e.Private()...)
			if err := a.toRTR(c, &e.QP); err != nil {
				a.failLocked(now, c, err)
				return
			}
		}
		if err := c.qp.Modify(&ib.QPAttr{State: ib.RTS, SQPSN: e.QP.SQPSN, Timeout: e.QP.Timeout,
			RetryCnt: e.QP.RetryCount, RNRRetry: e.QP.RNRRetry, MaxRdAtomic: e.QP.MaxRdAtomic},
			ib.AttrState|ib.AttrSQPSN|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|ib.AttrMaxQPRdAtomic); err != nil {
			a.failLocked(now, c, err)
			return
		}
		c.established = true
		c.settleLocked(nil)
	case cm.EventRejected:
		if c := a.conns[e.ID]; c != nil {
			err := &RejectedError{Reason: e.Reason, PrivateData: append([]byte(nil), e.Private()...)}
			if c.established {
				_ = c.qp.Modify(&ib.QPAttr{State: ib.Err}, ib.AttrState) // the application's QP: it may be gone
				c.finishLocked(err)
				return
			}
			c.finishLocked(err)
		}
	case cm.EventTimeout:
		if c := a.conns[e.ID]; c != nil {
			c.finishLocked(ErrTimeout)
		}
	case cm.EventDisconnectRequest, cm.EventDisconnected:
		if c := a.conns[e.ID]; c != nil {
			// ERR flushes the WRs the application still has posted: it
			// learns of the disconnection from its CQ too, as with rdma_cm.
			// (The application may have destroyed its QP already.)
			_ = c.qp.Modify(&ib.QPAttr{State: ib.Err}, ib.AttrState)
			c.finishLocked(ErrDisconnected)
		}
	case cm.EventTimeWaitExit:
		if c := a.conns[e.ID]; c != nil {
			delete(a.conns, e.ID)
			if a.byQPN[c.qp.QPN()] == c {
				delete(a.byQPN, c.qp.QPN())
			}
		}
	case cm.EventConnResponse:
		// Only the event interface defers RTUs: its connections are
		// handled above.
	}
}

// failLocked aborts a connection whose QP could not be programmed.
func (a *Agent) failLocked(now clock.Time, c *conn, err error) {
	a.stats.QPErrors++
	_ = a.m.Abort(now, c.id)                                 // fails only for a connection already gone
	_ = c.qp.Modify(&ib.QPAttr{State: ib.Err}, ib.AttrState) // the QP just failed a transition

	c.finishLocked(fmt.Errorf("rdmacm: QP %#x: %w", c.qp.QPN(), err))
}

// toRTR programs c's QP for receiving from the peer the CM negotiated.
func (a *Agent) toRTR(c *conn, q *cm.QPAttr) error {
	mac, ok := a.macs[c.peer]
	if !ok {
		return fmt.Errorf("no MAC for %v", c.peer)
	}
	idx, _, err := a.sgid(c.peer)
	if err != nil {
		return err
	}
	mtu := min(cm.MTUBytes(q.PathMTU), a.pmtu)
	return c.qp.Modify(&ib.QPAttr{State: ib.RTR, PathMTU: uint32(mtu), DestQPN: q.RemoteQPN, RQPSN: q.RQPSN,
		MaxDestRdAtomic: q.MaxDestRdAtomic, MinRNRTimer: c.minRNR,
		AV: ib.AddressVector{DMAC: mac, DGID: ib.GIDFrom(c.peer), SGIDIndex: uint8(idx),
			TrafficClass: q.TrafficClass, HopLimit: q.HopLimit, FlowLabel: q.FlowLabel}},
		ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer)
}
