package runner

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/softrnic/softrnic/perftest"
	"github.com/softrnic/softrnic/verbs/wr"
)

// Run implements perftest.Local: the measurement at one message size.
func (t *Test) Run(size uint64) (perftest.BWReport, error) {
	t.header()
	switch {
	case t.p.Measure == perftest.BW && t.client:
		r, err := t.runBW(size)
		if err == nil {
			t.res.BW = append(t.res.BW, r)
			t.printf("%s", perftest.FormatBW(r, t.p.ReportGbits))
		}
		return r, err
	case t.p.Measure == perftest.BW && t.p.Verb == perftest.Send:
		return perftest.BWReport{}, t.runSendServer(size)
	case t.p.Measure == perftest.Latency:
		r, err := t.runLat(size)
		if err == nil {
			t.res.Lat = append(t.res.Lat, r)
			t.printf("%s", perftest.FormatLat(r))
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
	t.printf("%s", perftest.ResultLine)
	if t.p.Measure == perftest.BW {
		t.printf("%s", perftest.BWHeader(t.p.ReportGbits))
	} else {
		t.printf("%s", perftest.LatHeader)
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

// wqe builds message k of QP q.
func (t *Test) wqe(q *qp, k int, size uint64, signaled bool) *wr.SendWQE {
	// One WQE and SG list per QP, reused: Post copies them, so a message
	// costs no allocation on this side either.
	off := t.remoteOff(k, size)
	w := &q.wqe
	*w = wr.SendWQE{ID: uint64(k), Length: uint32(size), RemoteAddr: t.remote[q.idx].VAddr + off, RKey: t.remote[q.idx].RKey,
		SG: q.sg[:1]}
	if signaled {
		w.Flags = wr.Signaled
	}
	half := uint64(t.region / 2)
	switch t.p.Verb {
	case perftest.Write:
		w.Opcode = wr.RDMAWrite
		q.sg[0] = q.src[off : off+size]
	case perftest.Send:
		w.Opcode = wr.Send
		q.sg[0] = q.src[off : off+size]
	case perftest.Read:
		w.Opcode = wr.RDMARead
		q.sg[0] = q.src[half+off : half+off+size]
	case perftest.Atomic:
		w.Opcode = wr.AtomicFetchAndAdd
		w.Length = 8
		w.SwapAdd = 1
		q.sg[0] = q.src[half+off : half+off+8]
	}
	return w
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
	for _, q := range t.qps {
		q.seen = q.seen[:0]
	}
	lastProgress := now()
	for {
		finished := true
		for i, q := range t.qps {
			if deadline != 0 && now() >= deadline {
				iters = sent[i] // stop posting; wait for what is out
			}
			if done[i] < iters {
				finished = false
			}
			q.mu.Lock()
			for sent[i] < iters && sent[i]-done[i] < t.p.TxDepth && q.rc.SendQueueFree() > 0 {
				k := sent[i]
				last := k == iters-1 || (deadline != 0 && k%cqMod == cqMod-1)
				if !q.rc.Post(t.wqe(q, k, size, (k+1)%cqMod == 0 || last)) {
					break
				}
				posted = append(posted, now())
				sent[i]++
			}
			q.mu.Unlock()
		}
		if finished {
			break
		}
		t.h.Engine.Kick()
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
		} else if now()-lastProgress > int64(t.stallLimit()) {
			return perftest.BWReport{}, t.errStall()
		}
		if deadline != 0 && now() >= deadline {
			// Signal the last message so its completion ends the run.
			for i := range t.qps {
				if sent[i] > done[i] && (sent[i])%cqMod != 0 {
					iters = min(iters, sent[i])
				}
			}
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
				if w.ByteLen != uint32(size) {
					return fmt.Errorf("perf: QP %#x: received %d bytes, want %d", q.qpn, w.ByteLen, size)
				}
				k := got[i]
				if t.p.Verify {
					slot := t.recvSlot(q, int(w.ID), size)
					if err := checkPattern(slot, q.idx, int(t.remoteOff(k, size)), true); err != nil {
						return fmt.Errorf("perf: QP %#x message %d: %w", q.qpn, k, err)
					}
				}
				got[i]++
				if posted[i] < want {
					q.mu.Lock()
					q.rq.post(w.ID, t.recvSlot(q, int(w.ID), size), uint32(size))
					q.mu.Unlock()
					posted[i]++
				}
			}
			q.seen = q.seen[:0]
		}
		t.h.Engine.Kick()
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
			if err := t.post(q, &wr.SendWQE{ID: uint64(i), Opcode: wr.Send, SG: [][]byte{q.src[:size]}, Length: uint32(size)}); err != nil {
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
			q.mu.Lock()
			src[size-1] = marker
			q.mu.Unlock()
			w := &wr.SendWQE{ID: uint64(i), Opcode: wr.RDMAWrite, SG: [][]byte{src}, Length: uint32(size),
				RemoteAddr: t.remote[0].VAddr, RKey: t.remote[0].RKey}
			if i == iters-1 {
				// write_lat has no closing handshake: the last WRITE must be
				// acknowledged before this side may go away.
				w.Flags = wr.Signaled
			}
			if err := t.post(q, w); err != nil {
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
			if err := t.post(q, w); err != nil {
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

// post posts one send WQE on q and kicks the engine.
func (t *Test) post(q *qp, w *wr.SendWQE) error {
	for start := now(); ; {
		q.mu.Lock()
		ok := q.rc.Post(w)
		q.mu.Unlock()
		t.h.Engine.Kick()
		if ok {
			return nil
		}
		if _, err := t.poll(); err != nil {
			return err
		}
		if now()-start > int64(t.stallLimit()) {
			return t.errStall()
		}
	}
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
			slot := t.recvSlot(q, 0, size)
			if w.ByteLen != uint32(size) {
				return fmt.Errorf("perf: received %d bytes, want %d", w.ByteLen, size)
			}
			if t.p.Verify {
				if err := checkPattern(slot, q.idx, 0, !t.client); err != nil {
					return fmt.Errorf("perf: message %d: %w", i, err)
				}
			}
			q.mu.Lock()
			q.rq.post(uint64(i+1), slot, uint32(size))
			q.mu.Unlock()
			return nil
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
func dropSends(s []wr.WC) []wr.WC {
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
		q.mu.Lock()
		got := q.src[size-1]
		var err error
		if got == marker && t.p.Verify {
			err = checkPattern(q.src[:size-1], q.idx, t.region/2, !t.client)
		}
		q.mu.Unlock()
		if got == marker {
			return err
		}
		// Keep what poll collected: the completion of our own last WRITE
		// may come in while we wait for the peer's, and waitSend needs it.
		if _, err := t.poll(); err != nil {
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
	q.mu.Lock()
	defer q.mu.Unlock()
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
		q.mu.Lock()
		var err error
		switch {
		case t.p.Verb == perftest.Write && !t.client:
			for k := 0; k < iters && k < int(uint64(t.neg.PageSize)/roundUp(size, uint64(t.neg.CacheLine)))+1; k++ {
				off := int(t.remoteOff(k, size))
				if err = checkPattern(q.src[off:off+int(size)], q.idx, off, true); err != nil {
					err = fmt.Errorf("perf: QP %#x, WRITE %d at offset %d: %w", q.qpn, k, off, err)
					break
				}
			}
		case t.p.Verb == perftest.Read && t.client:
			for k := 0; k < iters && k < int(uint64(t.neg.PageSize)/roundUp(size, uint64(t.neg.CacheLine)))+1; k++ {
				off := int(t.remoteOff(k, size))
				if err = checkPattern(q.src[half+off:half+off+int(size)], q.idx, off, false); err != nil {
					err = fmt.Errorf("perf: QP %#x, READ %d at offset %d: %w", q.qpn, k, off, err)
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
				err = fmt.Errorf("perf: QP %#x: FETCH_AND_ADDs added %d, want %d", q.qpn, sum, iters)
			}
		}
		q.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
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
