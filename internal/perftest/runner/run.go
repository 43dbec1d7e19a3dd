package runner

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/perftest"
	"github.com/softrnic/softrnic/verbs"
)

// Run implements perftest.Local: the measurement at one message size.
func (t *Test) Run(size uint64) (perftest.BWReport, error) {
	t.header()
	switch {
	case t.p.Measure == perftest.BW && t.client:
		r, err := t.runBW(size)
		if err == nil {
			t.res.BW = append(t.res.BW, r)
			t.print(perftest.FormatBW(r, t.p.ReportGbits))
		}
		return r, err
	case t.p.Measure == perftest.BW && t.p.Verb == perftest.Send:
		return perftest.BWReport{}, t.runSendServer(size)
	case t.p.Measure == perftest.Latency:
		r, err := t.runLat(size)
		if err == nil {
			t.res.Lat = append(t.res.Lat, r)
			t.print(perftest.FormatLat(r))
		}
		return perftest.BWReport{}, err
	}
	return perftest.BWReport{}, nil // a passive server has nothing to run
}

// header prints the column titles once, before the first row.
func (t *Test) header() {
	if t.headerDone {
		return
	}
	t.headerDone = true
	t.print(perftest.ResultLine)
	if t.p.Measure == perftest.BW {
		t.print(perftest.BWHeader(t.p.ReportGbits))
	} else {
		t.print(perftest.LatHeader)
	}
}

// remoteOff is where message k of size bytes goes in the peer's buffer:
// perftest's cycle of size rounded up to the cache line within one page
// (or offset 0 for messages of a page or more), which any perftest peer's
// buffer holds.
func (t *Test) remoteOff(k int, size uint64) uint64 {
	inc := roundUp(size, uint64(t.neg.CacheLine))
	page := uint64(t.neg.PageSize)
	if t.p.Verb == perftest.Atomic {
		inc = 8
	}
	slots := max(page/inc, 1)
	return (uint64(k) % slots) * inc
}

// wqe builds message k of QP q into q's one reusable WR.
func (t *Test) wqe(q *qp, k int, size uint64, signaled bool) *verbs.SendWR {
	off := t.remoteOff(k, size)
	half := uint64(t.region / 2)
	switch t.p.Verb {
	case perftest.Write:
		return t.setWR(q, uint64(k), ib.RDMAWrite, off, size, off, signaled)
	case perftest.Read:
		return t.setWR(q, uint64(k), ib.RDMARead, half+off, size, off, signaled)
	case perftest.Atomic:
		w := t.setWR(q, uint64(k), ib.AtomicFetchAndAdd, half+off, 8, off, signaled)
		w.CompareAdd = 1
		return w
	default:
		if t.udDatum {
			// UD may lose a message: sending every one from offset 0
			// keeps the receiver's --verify independent of which arrived.
			off = 0
		}
		return t.setWR(q, uint64(k), ib.Send, off, size, 0, signaled)
	}
}

// setWR fills q's one WR and SGE (PostSend copies them, so a message costs
// no allocation on this side): n bytes at offset local of q's region, to
// offset remote of the peer's (RDMA and atomics) or, on UD, to the peer's
// QP through its address handle.
func (t *Test) setWR(q *qp, id uint64, op ib.WROpcode, local, n, remote uint64, signaled bool) *verbs.SendWR {
	q.sge[0] = ib.SGE{Addr: q.va + local, Length: uint32(n), LKey: t.mr.LKey()}
	w := &q.wr[0]
	*w = verbs.SendWR{ID: id, Opcode: op, SG: q.sge[:]}
	if signaled {
		w.Flags = ib.Signaled
	}
	d := t.remote[q.idx]
	switch {
	case t.udDatum:
		w.AH, w.RemoteQPN, w.RemoteQKey = q.ah, d.QPN, t.udRemoteQKey()
	case op != ib.Send:
		w.RemoteAddr, w.RKey = d.VAddr+remote, d.RKey
	}
	return w
}

// tryPost posts q's WR; false when the send queue is full.
func (t *Test) tryPost(q *qp) (bool, error) {
	if _, err := q.qp.PostSend(q.wr[:]); err != nil {
		if errors.Is(err, verbs.ErrQueueFull) {
			return false, nil
		}
		return false, fmt.Errorf("perf: QP %#x: post: %w", q.qpn(), err)
	}
	return true, nil
}

// runBW is the client's bandwidth loop: per QP up to TX depth messages
// outstanding, one completion every CQ-moderation messages, -n messages per
// QP or -D seconds.
func (t *Test) runBW(size uint64) (perftest.BWReport, error) {
	iters := int(t.p.Iters)
	var deadline int64
	if t.p.Duration > 0 {
		iters = 1 << 30
		deadline = now() + int64(t.p.Duration)
	}
	cqMod := max(t.p.CQMod, 1)
	total := iters * len(t.qps)
	capHint := min(total, 1<<22)
	posted := make([]int64, 0, capHint)
	completed := make([]int64, 0, capHint)
	sent := make([]int, len(t.qps))
	done := make([]int, len(t.qps))
	target := make([]int, len(t.qps)) // messages QP i posts in all
	for i, q := range t.qps {
		q.seen = q.seen[:0]
		target[i] = iters
	}
	lastProgress := now()
	lastMoved := t.transportProgress()
	for {
		finished := true
		expired := deadline != 0 && now() >= deadline
		for i, q := range t.qps {
			if expired {
				// -D is over: post up to the next signaled message, whose
				// completion covers every unsignaled one before it.
				target[i] = min(target[i], int(roundUp(uint64(sent[i]), uint64(cqMod))))
			}
			if done[i] < target[i] {
				finished = false
			}
			for sent[i] < target[i] && sent[i]-done[i] < t.p.TxDepth {
				k := sent[i]
				t.wqe(q, k, size, (k+1)%cqMod == 0 || k == target[i]-1)
				ok, err := t.tryPost(q)
				if err != nil {
					return perftest.BWReport{}, err
				}
				if !ok {
					break
				}
				posted = append(posted, now())
				sent[i]++
			}
		}
		if finished {
			break
		}
		n, err := t.poll()
		if err != nil {
			return perftest.BWReport{}, err
		}
		if n > 0 {
			ts := now()
			lastProgress = ts
			for i, q := range t.qps {
				for _, w := range q.seen {
					k := int(w.ID)
					for ; done[i] <= k; done[i]++ {
						completed = append(completed, ts)
					}
				}
				q.seen = q.seen[:0]
			}
		} else if t.stalled(&lastProgress, &lastMoved) {
			return perftest.BWReport{}, t.errStall()
		}
	}
	r := perftest.ComputeBW(size, posted, completed, cqMod, t.p.ReportGbits)
	return r, nil
}

// runSendServer counts the client's SENDs, reposting receives, and checks
// each with --verify.
func (t *Test) runSendServer(size uint64) error {
	want := int(t.p.Iters)
	if t.p.Duration > 0 {
		return errors.New("perf: send_bw -D needs the server to know when the client stops; run it with -n")
	}
	got := make([]int, len(t.qps))
	posted := make([]int, len(t.qps))
	for i := range posted {
		posted[i] = t.p.RxDepth
	}
	lastProgress := now()
	for {
		all := true
		for i := range t.qps {
			all = all && got[i] >= want
		}
		if all {
			return nil
		}
		n, err := t.poll()
		if err != nil {
			return err
		}
		if n == 0 {
			if now()-lastProgress > int64(t.stallLimit()) {
				return t.errStall()
			}
			continue
		}
		lastProgress = now()
		for i, q := range t.qps {
			for _, w := range q.seen {
				if !w.IsRecv {
					continue
				}
				if w.ByteLen != uint32(t.slotLen(size)) {
					return fmt.Errorf("perf: QP %#x: received %d bytes, want %d", q.qpn(), w.ByteLen, t.slotLen(size))
				}
				k := got[i]
				if t.p.Verify {
					// RC and UC deliver in order, so message k came from
					// offset remoteOff(k) of the sender's region; a UD
					// sender (which may lose messages) sends from offset 0.
					off := int(t.remoteOff(k, size))
					if t.udDatum {
						off = 0
					}
					if err := checkPattern(t.recvData(q, w.ID, size), q.idx, off, true); err != nil {
						return fmt.Errorf("perf: QP %#x message %d: %w", q.qpn(), k, err)
					}
				}
				got[i]++
				q.recvBusy[w.ID] = false
				if posted[i] < want {
					if err := t.postRecv(q, w.ID); err != nil {
						return err
					}
					posted[i]++
				}
			}
			q.seen = q.seen[:0]
		}
	}
}

// checkPattern compares b with the pattern the sender wrote from offset off
// of its region.
func checkPattern(b []byte, idx, off int, client bool) error {
	for j := range b {
		if want := pattern(idx, off+j, client); b[j] != want {
			return fmt.Errorf("byte %d is %#x, want %#x", j, b[j], want)
		}
	}
	return nil
}

// runLat is the ping-pong (SEND: the client first; WRITE: the server
// first, as perftest's run_iter_lat_send and run_iter_lat_write) or
// request-response (READ, atomic: the client alone) latency loop on QP 0.
func (t *Test) runLat(size uint64) (perftest.LatReport, error) {
	if t.p.Duration > 0 {
		return perftest.LatReport{}, errors.New("perf: latency tests run -n iterations; -D is not supported")
	}
	q := t.qps[0]
	iters := int(t.p.Iters)
	stamps := make([]int64, 0, iters)
	half := t.region / 2
	for i := 0; i < iters; i++ {
		if t.client || i > 0 || t.p.Verb == perftest.Send || t.p.Verb == perftest.Write {
			stamps = append(stamps, now())
		}
		switch t.p.Verb {
		case perftest.Send:
			if !t.client {
				if err := t.waitRecv(q, size, i); err != nil {
					return perftest.LatReport{}, err
				}
			}
			t.setWR(q, uint64(i), ib.Send, 0, size, 0, false)
			if err := t.post(q); err != nil {
				return perftest.LatReport{}, err
			}
			if t.client {
				if err := t.waitRecv(q, size, i); err != nil {
					return perftest.LatReport{}, err
				}
			}
		case perftest.Write:
			// The last byte of each WRITE carries the iteration count as a
			// C char (1, 2, … 255, 0, 1, …), which the peer polls for in its
			// own memory. In perftest's write_lat the server writes first.
			marker := byte(i + 1)
			src := q.src[half : half+int(size)]
			if t.client {
				if err := t.waitMarker(q, size, marker); err != nil {
					return perftest.LatReport{}, err
				}
			}
			// Under the QP's lock: the previous WRITE may still be resent
			// from this buffer.
			withLock(q.qp, func() { src[size-1] = marker })
			// write_lat has no closing handshake: the last WRITE must be
			// acknowledged before this side may go away.
			t.setWR(q, uint64(i), ib.RDMAWrite, uint64(half), size, 0, i == iters-1)
			if err := t.post(q); err != nil {
				return perftest.LatReport{}, err
			}
			if !t.client {
				if err := t.waitMarker(q, size, marker); err != nil {
					return perftest.LatReport{}, err
				}
			}
			if i == iters-1 {
				if err := t.waitSend(q, i); err != nil {
					return perftest.LatReport{}, err
				}
			}
		case perftest.Read, perftest.Atomic:
			w := t.wqe(q, 0, size, true)
			w.ID = uint64(i)
			if err := t.post(q); err != nil {
				return perftest.LatReport{}, err
			}
			if err := t.waitSend(q, i); err != nil {
				return perftest.LatReport{}, err
			}
			if t.p.Verify {
				if err := t.checkResponse(q, size, i); err != nil {
					return perftest.LatReport{}, err
				}
			}
		}
	}
	stamps = append(stamps, now())
	deltas := make([]time.Duration, 0, len(stamps))
	for i := 1; i < len(stamps); i++ {
		deltas = append(deltas, time.Duration(stamps[i]-stamps[i-1]))
	}
	halfRTT := t.p.Verb == perftest.Send || t.p.Verb == perftest.Write
	r := perftest.ComputeLat(size, deltas, halfRTT)
	r.Iters = uint64(iters)
	return r, nil
}

// post posts q's WR, waiting for room in the send queue.
func (t *Test) post(q *qp) error {
	var start int64
	var moved uint64
	for {
		ok, err := t.tryPost(q)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if start == 0 { // the send queue is full: from now on we wait
			start, moved = now(), t.transportProgress()
		}
		if _, err := t.poll(); err != nil {
			return err
		}
		if t.stalled(&start, &moved) {
			return t.errStall()
		}
	}
}

// stalled says whether nothing moved for the stall limit since *last. At
// the limit it also looks at the QPs' transport progress (rc Counters): a
// CQ-moderated run (-Q 100, the default) signals one completion per 100
// messages, and a READ run recovering from 5 % loss in both directions
// moved forward steadily for 17 s without one (lab: the TCG guest re-served
// whole READs per go-back-N round). Progress there restarts the clock; a
// dead peer still ends the run, through retry exhaustion or here. *moved
// is the transport progress seen when *last was set.
func (t *Test) stalled(last *int64, moved *uint64) bool {
	ts := now()
	if ts-*last <= int64(t.stallLimit()) {
		return false
	}
	if p := t.transportProgress(); p != *moved {
		*moved = p
		*last = ts
		return false
	}
	return true
}

// transportProgress sums the rc Counters.Progress of the test's QPs.
// Through the daemon, which does not report it, it is 0 and only
// completions count as progress.
func (t *Test) transportProgress() uint64 {
	if pc, ok := t.dev.(verbs.ProgressCounter); ok {
		return pc.TransportProgress(t.qpns)
	}
	return 0
}

// waitRecv waits for the next receive completion on q, checks it with
// --verify and reposts the receive.
func (t *Test) waitRecv(q *qp, size uint64, i int) error {
	for start := now(); ; {
		for j, w := range q.seen {
			if !w.IsRecv {
				continue
			}
			q.seen = append(q.seen[:j], q.seen[j+1:]...)
			if w.ByteLen != uint32(t.slotLen(size)) {
				return fmt.Errorf("perf: received %d bytes, want %d", w.ByteLen, t.slotLen(size))
			}
			if t.p.Verify {
				if err := checkPattern(t.recvData(q, w.ID, size), q.idx, 0, !t.client); err != nil {
					return fmt.Errorf("perf: message %d: %w", i, err)
				}
			}
			q.recvBusy[w.ID] = false
			return t.postRecv(q, w.ID)
		}
		q.seen = dropSends(q.seen)
		if _, err := t.poll(); err != nil {
			return err
		}
		if now()-start > int64(t.stallLimit()) {
			return t.errStall()
		}
	}
}

// dropSends forgets send completions (latency tests signal only when they
// wait for one).
func dropSends(s []ib.WC) []ib.WC {
	out := s[:0]
	for _, w := range s {
		if w.IsRecv {
			out = append(out, w)
		}
	}
	return out
}

// waitSend waits for the completion of send WQE i.
func (t *Test) waitSend(q *qp, i int) error {
	for start := now(); ; {
		for j, w := range q.seen {
			if !w.IsRecv && w.ID == uint64(i) {
				q.seen = append(q.seen[:j], q.seen[j+1:]...)
				return nil
			}
		}
		if _, err := t.poll(); err != nil {
			return err
		}
		if now()-start > int64(t.stallLimit()) {
			return t.errStall()
		}
	}
}

// waitMarker polls the last byte of the peer's WRITE into our buffer.
func (t *Test) waitMarker(q *qp, size uint64, marker byte) error {
	for start := now(); ; {
		// The peer's WRITE lands under the QP's lock: read it there.
		var got byte
		var err error
		withLock(q.qp, func() {
			got = q.src[size-1]
			if got == marker && t.p.Verify {
				err = checkPattern(q.src[:size-1], q.idx, t.region/2, !t.client)
			}
		})
		if got == marker {
			return err
		}
		// Keep what poll collected: the completion of our own last WRITE
		// may come in while we wait for the peer's, and waitSend needs it.
		if _, err := t.pollFor(true); err != nil {
			return err
		}
		if now()-start > int64(t.stallLimit()) {
			return t.errStall()
		}
	}
}

// checkResponse checks what READ or FETCH_AND_ADD i brought back.
func (t *Test) checkResponse(q *qp, size uint64, i int) error {
	half := t.region / 2
	var err error
	withLock(q.qp, func() { err = t.checkResponseLocked(q, size, i, half) })
	return err
}

func (t *Test) checkResponseLocked(q *qp, size uint64, i, half int) error {
	if t.p.Verb == perftest.Atomic {
		base := atomicBase(q.idx, 0)
		if v, want := binary.NativeEndian.Uint64(q.src[half:]), binary.NativeEndian.Uint64(base[:])+uint64(i); v != want {
			return fmt.Errorf("perf: FETCH_AND_ADD %d returned %#x, want %#x", i, v, want)
		}
		return nil
	}
	return checkPattern(q.src[half:half+int(size)], q.idx, 0, false)
}

// verifyAfter checks, once the peer is done, what it left in our memory:
// a write_bw server its WRITEs, a read_bw client what it read, an
// atomic_bw server the sum of the FETCH_AND_ADDs.
func (t *Test) verifyAfter(out perftest.Outcome) error {
	if t.p.Measure != perftest.BW {
		return nil
	}
	size := out.Sizes[len(out.Sizes)-1]
	iters := int(t.p.Iters)
	if out.PeerReport != nil && !t.client && len(t.qps) > 0 {
		iters = int(out.PeerReport.Iters) / len(t.qps)
	}
	half := t.region / 2
	for _, q := range t.qps {
		var err error
		withLock(q.qp, func() { err = t.verifyLocked(q, size, iters, half) })
		// A UC WRITE completes at its requester when sent, not when it has
		// landed (UC has no ACK), so the peer's "done" can overtake its last
		// frames — by a whole engine step when this side's QPs live in a
		// daemon. Give them a bounded time to land before calling it a
		// data error.
		for wait := uwriteLandWait; err != nil && wait > 0 && t.p.Transport == perftest.UC && t.p.Verb == perftest.Write; wait -= uwriteLandStep {
			time.Sleep(uwriteLandStep)
			withLock(q.qp, func() { err = t.verifyLocked(q, size, iters, half) })
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// uwriteLandWait bounds how long the responder of a UC WRITE test waits for
// the last WRITEs to land before verifying fails.
const (
	uwriteLandWait = 2 * time.Second
	uwriteLandStep = 5 * time.Millisecond
)

// verifyLocked is verifyAfter for one QP, under its lock.
func (t *Test) verifyLocked(q *qp, size uint64, iters, half int) error {
	var err error
	{
		switch {
		case t.p.Verb == perftest.Write && !t.client:
			for k := 0; k < iters && k < int(uint64(t.neg.PageSize)/roundUp(size, uint64(t.neg.CacheLine)))+1; k++ {
				off := int(t.remoteOff(k, size))
				if err = checkPattern(q.src[off:off+int(size)], q.idx, off, true); err != nil {
					err = fmt.Errorf("perf: QP %#x, WRITE %d at offset %d: %w", q.qpn(), k, off, err)
					break
				}
			}
		case t.p.Verb == perftest.Read && t.client:
			for k := 0; k < iters && k < int(uint64(t.neg.PageSize)/roundUp(size, uint64(t.neg.CacheLine)))+1; k++ {
				off := int(t.remoteOff(k, size))
				if err = checkPattern(q.src[half+off:half+off+int(size)], q.idx, off, false); err != nil {
					err = fmt.Errorf("perf: QP %#x, READ %d at offset %d: %w", q.qpn(), k, off, err)
					break
				}
			}
		case t.p.Verb == perftest.Atomic && !t.client:
			var sum uint64
			for off := 0; off < t.neg.PageSize; off += 8 {
				base := atomicBase(q.idx, off)
				sum += binary.NativeEndian.Uint64(q.src[off:]) - binary.NativeEndian.Uint64(base[:])
			}
			if sum != uint64(iters) {
				err = fmt.Errorf("perf: QP %#x: FETCH_AND_ADDs added %d, want %d", q.qpn(), sum, iters)
			}
		}
	}
	return err
}

// atomicBase is the initial content of an 8-byte atomic slot (our server
// pattern).
func atomicBase(idx, off int) [8]byte {
	var b [8]byte
	for j := range b {
		b[j] = pattern(idx, off+j, false)
	}
	return b
}
