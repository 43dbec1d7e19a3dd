package sim

import (
	"math/bits"

	"github.com/softrnic/softrnic/clock"
)

// The event queue is a timing wheel of one-nanosecond buckets over the next
// wheelSize ns, with a heap for events beyond it. All events of one bucket
// have the same time, so firing a bucket in insertion order fires them in
// scheduling order: the wheel gives exactly the (time, sequence) order of
// a single heap, in O(1) per event instead of O(log n). Events that were
// scheduled beyond the horizon move into the wheel, in (time, sequence)
// order, as soon as the horizon reaches them — before anything else can be
// scheduled at their time, so they keep their place in front of it.
const (
	wheelBits  = 15
	wheelSize  = 1 << wheelBits // ns of horizon
	wheelMask  = wheelSize - 1
	wheelWords = wheelSize / 64
)

type evq struct {
	slab []event // wheel events, linked per bucket by next
	free int32

	head, tail []int32                 // per bucket; -1 when empty
	used       []uint64                // bit per non-empty bucket
	summary    [wheelWords / 64]uint64 // bit per non-zero used word
	cur        clock.Time              // the bucket being fired; wheel events are in [cur, cur+wheelSize)
	n          int                     // events in the wheel

	far eventHeap // events at or beyond cur+wheelSize
	seq uint64

	// Late counts events scheduled before cur (fired at cur, after what
	// is already there). The simulator never does this; tests check.
	late uint64
}

func newEvq() *evq {
	q := &evq{free: -1, head: make([]int32, wheelSize), tail: make([]int32, wheelSize), used: make([]uint64, wheelWords)}
	for i := range q.head {
		q.head[i], q.tail[i] = -1, -1
	}
	return q
}

func (q *evq) len() int { return q.n + q.far.len() }

func (q *evq) push(e event) {
	q.seq++
	e.seq = q.seq
	if e.at < q.cur {
		q.late++
		e.at = q.cur
	}
	if e.at-q.cur >= wheelSize {
		q.far.push(e)
		return
	}
	q.insert(e)
}

// insert links e at the tail of its bucket.
func (q *evq) insert(e event) {
	i := q.free
	if i >= 0 {
		q.free = q.slab[i].next
	} else {
		q.slab = append(q.slab, event{})
		i = int32(len(q.slab) - 1)
	}
	e.next = -1
	q.slab[i] = e
	b := int(e.at & wheelMask)
	if t := q.tail[b]; t >= 0 {
		q.slab[t].next = i
	} else {
		q.head[b] = i
		w := b >> 6
		if q.used[w] == 0 {
			q.summary[w>>6] |= 1 << (w & 63)
		}
		q.used[w] |= 1 << (b & 63)
	}
	q.tail[b] = i
	q.n++
}

// nextBucket is the first non-empty bucket at or after cur, circularly, as
// an offset from cur. q.n must be > 0.
func (q *evq) nextBucket() int {
	start := int(q.cur & wheelMask)
	w := start >> 6
	if m := q.used[w] >> (start & 63); m != 0 {
		return bits.TrailingZeros64(m)
	}
	// The next non-empty word after w, through the summary, wrapping
	// round to w itself (whose remaining buckets lie before start, a full
	// turn ahead).
	for i := 1; i <= wheelWords; {
		ww := (w + i) & (wheelWords - 1)
		if m := q.summary[ww>>6] >> (ww & 63); m != 0 {
			ww += bits.TrailingZeros64(m)
			b := ww<<6 | bits.TrailingZeros64(q.used[ww])
			return (b - start) & wheelMask
		}
		i += 64 - ww&63
	}
	panic("sim: event wheel count out of step with its buckets")
}

// pop removes and returns the next event if it is due at or before end.
func (q *evq) pop(end clock.Time) (event, bool) {
	var t clock.Time
	switch {
	case q.n > 0:
		t = q.cur + clock.Time(q.nextBucket())
	case q.far.len() > 0:
		t = q.far.ev[0].at
	default:
		return event{}, false
	}
	if t > end {
		return event{}, false
	}
	if t != q.cur {
		q.advance(t)
	}
	b := int(t & wheelMask)
	i := q.head[b]
	e := q.slab[i]
	q.head[b] = e.next
	if e.next < 0 {
		q.tail[b] = -1
		w := b >> 6
		q.used[w] &^= 1 << (b & 63)
		if q.used[w] == 0 {
			q.summary[w>>6] &^= 1 << (w & 63)
		}
	}
	q.slab[i].next = q.free
	q.free = i
	q.n--
	return e, true
}

// advance moves the wheel to t (every bucket before it is empty) and pulls
// in the far events the horizon now covers.
func (q *evq) advance(t clock.Time) {
	q.cur = t
	for q.far.len() > 0 && q.far.ev[0].at-t < wheelSize {
		q.insert(q.far.pop())
	}
}
