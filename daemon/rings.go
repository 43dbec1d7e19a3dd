package daemon

import (
	"errors"
	"sync/atomic"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/shmring"
	"github.com/softrnic/softrnic/verbs"
)

// The data path. A client's SQ and RQ rings are its device QP's work
// queues, and its SRQ rings its device SRQs': the device's engine fetches
// from them at every step (queues, an rnic.Queues), so a post is a memory
// write the engine finds while it runs. A client's CQ ring is its device CQ's store (cqSink, an
// rnic.CQSink): the device writes each completion into it where it
// produces it, and the client polls it. Only an engine going to sleep
// arms the rings' wakeup flags, and only a client going to sleep arms its
// CQ ring's: a syscall is paid only by a side that finds the other asleep.

// fetchBatch bounds the WRs taken from one ring per step, for fairness
// between QPs and clients (the device's Transmit is round-robin too).
const fetchBatch = 64

// queues is the Server's rnic.Queues. Its methods run in the engine's
// goroutine, which owns its state and the rings' consumer sides.
type queues struct {
	s  *Server
	rr int // the QP visited first, one further each step
}

// Fetch takes what the clients posted into the device: for each QP in
// turn, up to fetchBatch WRs of its RQ and of its SQ, and as many of each
// SRQ's. It first notes how many send WRs each SQ holds, then drains the
// RQs and the SRQs, then posts the noted send WRs: a receive a client
// posted before a peer's SEND was posted is thus always with the device
// before that SEND executes.
func (r *queues) Fetch(clock.Time) bool {
	s := r.s
	s.ringsMu.RLock()
	defer s.ringsMu.RUnlock()
	if s.detached {
		return false
	}
	qs := s.qpList
	if len(qs) == 0 {
		return false
	}
	start := r.rr % len(qs)
	r.rr++
	for i := range qs {
		if q := qs[(start+i)%len(qs)]; !q.broken {
			q.sqReady = min(q.sqc.Len(), fetchBatch)
		}
	}
	work := 0
	for i := range qs {
		if q := qs[(start+i)%len(qs)]; !q.broken {
			work += s.fetchRecv(q)
		}
	}
	for _, x := range s.srqList {
		if !x.broken {
			work += s.fetchSRQ(x)
		}
	}
	for i := range qs {
		if q := qs[(start+i)%len(qs)]; !q.broken && q.sqReady > 0 {
			work += s.fetchSend(q)
		}
	}
	if work == 0 {
		s.idleFetches.Add(1)
	}
	return work > 0
}

// Arm sets every ring's wakeup flag, so that a client's next post rings
// its doorbell, and reports whether all of them are still empty. A ring
// whose WRs the device has no room for does not count: the engine wakes
// for the frames that make room.
func (r *queues) Arm() bool {
	s := r.s
	s.ringsMu.RLock()
	defer s.ringsMu.RUnlock()
	idle := true
	for _, q := range s.qpList {
		if q.broken {
			continue
		}
		if !q.sqc.Arm() && !q.sqBlocked {
			idle = false
		}
		if !q.rqc.Arm() && !q.rqBlocked {
			idle = false
		}
	}
	for _, x := range s.srqList {
		if !x.broken && !x.cons.Arm() && !x.blocked {
			idle = false
		}
	}
	return idle || s.detached
}

// Disarm clears the flags: while the engine runs, posts cost nothing.
func (r *queues) Disarm() {
	s := r.s
	s.ringsMu.RLock()
	defer s.ringsMu.RUnlock()
	for _, q := range s.qpList {
		q.sqc.Disarm()
		q.rqc.Disarm()
	}
	for _, x := range s.srqList {
		x.cons.Disarm()
	}
}

// fetchRecv posts up to fetchBatch receive WRs of q's RQ ring to its
// device QP and returns how many it took.
func (s *Server) fetchRecv(q *qpObj) int {
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	k, peeked := 0, 0
	var bad error
	for k < fetchBatch {
		slot := q.rqc.Peek()
		if slot == nil {
			break
		}
		peeked++
		if bad = decodeRecv(slot, &q.rwr[k]); bad != nil {
			break
		}
		k++
	}
	left := s.postRecvs(q, q.rwr[:k])
	if bad != nil {
		if left > 0 {
			left++ // the malformed one waits its turn too
		} else {
			s.recvInError(q, q.rwr[k].ID, bad)
		}
	}
	q.rqBlocked = left > 0
	if left > 0 {
		q.rqc.Rewind(left)
	}
	q.rqc.Release()
	s.checkRings(q)
	return peeked - left
}

// refillRQ is the QP's receive refill (rnic.QP.SetRecvRefill): when a
// message finds the device's RQ empty, the device takes the receives the
// client has already posted to its ring, so that a UC or UD message sent
// right after the client posted its receive (and told its peer so) is not
// dropped, nor an RC one answered with an RNR NAK, because it came in the
// same step as that post, before the step's Fetch. It never waits: if a
// Fetch holds the ring, the receives are on their way; an entry the device
// does not take as it is is left to Fetch, which fails it properly.
func (q *qpObj) refillRQ(post func(*verbs.RecvWR) bool) {
	if q.broken || !q.rqMu.TryLock() {
		return
	}
	defer q.rqMu.Unlock()
	for q.rqc.Err() == nil {
		slot := q.rqc.Peek()
		if slot == nil {
			break
		}
		w := &q.rwr[0]
		if decodeRecv(slot, w) != nil || !post(w) {
			q.rqc.Unpeek()
			break
		}
	}
	q.rqc.Release()
}

// postRecvs posts ws, posting in error each WR the device refuses
// (recvInError), and returns how many it left unposted because the
// device's RQ was full.
func (s *Server) postRecvs(q *qpObj, ws []verbs.RecvWR) int {
	for len(ws) > 0 {
		n, err := q.qp.PostRecv(ws)
		ws = ws[n:]
		switch {
		case err == nil:
			return 0
		case errors.Is(err, verbs.ErrQueueFull):
			return len(ws)
		}
		s.recvInError(q, ws[0].ID, err)
		ws = ws[1:]
	}
	return 0
}

// fetchSRQ posts up to fetchBatch receive WRs of an SRQ's ring to the
// device's SRQ and returns how many it took. A slot that does not decode,
// a WR the SRQ refuses, or indexes the client scribbled over retire the
// SRQ (srqBroken): the receives it already holds stay usable.
func (s *Server) fetchSRQ(x *srqObj) int {
	k := 0
	var bad error
	for k < fetchBatch {
		slot := x.cons.Peek()
		if slot == nil {
			break
		}
		if bad = decodeRecv(slot, &x.wr[k]); bad != nil {
			break
		}
		k++
	}
	n, err := x.srq.PostRecv(x.wr[:k])
	x.blocked = errors.Is(err, verbs.ErrQueueFull)
	switch {
	case x.blocked:
		left := k - n
		if bad != nil {
			left++
		}
		x.cons.Rewind(left)
	case err != nil:
		s.srqBroken(x, err)
	case bad != nil:
		s.srqBroken(x, bad)
	}
	x.cons.Release()
	if !x.broken && x.cons.Err() != nil {
		s.srqBroken(x, x.cons.Err())
	}
	return n
}

// fetchSend posts the send WRs of q's SQ ring that Fetch noted to its
// device QP and returns how many it took.
func (s *Server) fetchSend(q *qpObj) int {
	k, peeked := 0, 0
	var bad error
	for k < q.sqReady {
		slot := q.sqc.Peek()
		if slot == nil {
			break
		}
		peeked++
		if bad = s.decodeSend(q, slot, &q.swr[k]); bad != nil {
			break
		}
		k++
	}
	left := s.postSends(q, q.swr[:k])
	if bad != nil && (left > 0 || !s.sendInError(q, q.swr[k].ID, q.swr[k].Opcode, bad)) {
		left++ // the malformed one waits its turn too
	}
	q.sqBlocked = left > 0
	if left > 0 {
		q.sqc.Rewind(left)
	}
	q.sqc.Release()
	s.checkRings(q)
	return peeked - left
}

// postSends is postRecvs for send WRs (sendInError).
func (s *Server) postSends(q *qpObj, ws []verbs.SendWR) int {
	for len(ws) > 0 {
		n, err := q.qp.PostSend(ws)
		ws = ws[n:]
		if err == nil {
			return 0
		}
		if errors.Is(err, verbs.ErrQueueFull) || !s.sendInError(q, ws[0].ID, ws[0].Opcode, err) {
			return len(ws)
		}
		ws = ws[1:]
	}
	return 0
}

// decodeSend turns an SQ ring slot into w: the one place where a client's
// bytes become a send WR, checked before the device sees it. A UD WR
// names one of the session's address handles, never a raw destination;
// an unknown handle leaves w.AH nil, and the device completes the WR in
// error as for a destroyed AH.
func (s *Server) decodeSend(q *qpObj, slot []byte, w *verbs.SendWR) error {
	ah, err := proto.GetSendWR(slot, w, q.typ == ib.UD)
	if err != nil {
		return err
	}
	if q.typ == ib.UD {
		if a := q.owner.lookupAH(ah); a != nil {
			w.AH = a
		}
	}
	return nil
}

// decodeRecv is decodeSend for an RQ ring slot.
func decodeRecv(slot []byte, w *verbs.RecvWR) error {
	return proto.GetRecvWR(slot, w)
}

// checkRings retires a QP whose client scribbled over its ring indexes.
func (s *Server) checkRings(q *qpObj) {
	if q.broken || (q.sqc.Err() == nil && q.rqc.Err() == nil) {
		return
	}
	s.BadWQEs.Add(1)
	q.broken = true
	if q.qp.State() != ib.Err {
		// A move the daemon makes, not the device: the device raises no
		// event for it, so the daemon does.
		s.ownEvent(q.owner, proto.AsyncEventMsg{Type: ib.EventQPFatal, Handle: q.h, QPN: q.qp.QPN()})
	}
	attr := ib.QPAttr{State: ib.Err}
	if err := q.qp.Modify(&attr, ib.AttrState); err != nil {
		s.log.Error("moving a QP to error", "client", q.owner.id, "qpn", q.qp.QPN(), "err", err)
	}
	s.log.Warn("client corrupted a work queue ring; QP moved to error", "client", q.owner.id, "qpn", q.qp.QPN())
}

// A WR of a client's ring that does not decode, or that the device
// refuses, reached the device without ibv_post_send's or ibv_post_recv's
// checks, which would have refused it: the device meets it as an RNIC
// meets a bad WQE in its queue (rnic.QP.PostSendInError,
// PostRecvInError). It completes in error, in order, and stops the QP;
// counted in bad_wqes. A WR refused only for the QP's state (a send
// before RTS, a receive in RESET) completes in error at once, the QP left
// as it is, and is not counted.

// sendInError posts send WR id in error; false when the device's SQ is
// full: the entry stays in the ring for the next Fetch. It is counted
// before it is posted, so that a client that sees its completion sees
// the count, and once, however long it waits for room.
func (s *Server) sendInError(q *qpObj, id uint64, op ib.WROpcode, err error) bool {
	if !q.badWaiting || q.badWaitingID != id {
		s.countBad(err)
	}
	perr := q.qp.PostSendInError(id, op, ib.LocQPOpErr) // a destroyed QP: its completions go nowhere
	q.badWaiting, q.badWaitingID = errors.Is(perr, verbs.ErrQueueFull), id
	return !q.badWaiting
}

// recvInError posts receive WR id in error, counted first: the device
// completes it at once.
func (s *Server) recvInError(q *qpObj, id uint64, err error) {
	s.countBad(err)
	_ = q.qp.PostRecvInError(id, ib.LocQPOpErr) // a destroyed QP: nowhere to complete
}

// countBad counts a WR posted in error as a bad WQE unless only the QP's
// state, or its destruction, refused it.
func (s *Server) countBad(err error) {
	if !errors.Is(err, verbs.ErrQPState) && !errors.Is(err, verbs.ErrDestroyed) {
		s.BadWQEs.Add(1)
	}
}

// cqSink is a client CQ ring as its device CQ's store. The device calls
// it under the CQ's lock, from the engine or from a control goroutine
// flushing a QP: the ring keeps one producer at a time.
type cqSink struct {
	prod *shmring.Producer
	rang *atomic.Uint64 // the Server's CQDoorbells
	// solicited: the batch being Put holds a completion that wakes a
	// client armed for solicited completions only.
	solicited bool
}

// Put implements rnic.CQSink: false when the client's ring is full (or
// its consumer index impossible), which overruns the CQ.
func (k *cqSink) Put(wc *ib.WC) bool {
	slot := k.prod.Reserve()
	if slot == nil {
		return false
	}
	proto.PutWC(slot, wc)
	// What wakes a CQ armed for solicited completions only: a message
	// with SE, and any completion in error (IBA 11.4.2.2).
	k.solicited = k.solicited || wc.Flags&ib.WCSolicited != 0 || wc.Status != ib.Success
	return true
}

// Publish implements rnic.CQSink: it publishes the batch and rings the
// client's CQ doorbell if it sleeps on the CQ, armed for any completion,
// or for solicited ones only and the batch holds one. The ring is
// disarmed by the ring that wakes it: one wake-up per arming.
func (k *cqSink) Publish() {
	rang, _ := k.prod.CommitSolicited(k.solicited)
	k.solicited = false
	if rang {
		k.rang.Add(1)
	}
}
