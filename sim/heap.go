package sim

import "github.com/softrnic/softrnic/clock"

// evKind is what an event does when it fires.
type evKind uint8

const (
	evFlowStart evKind = iota // a flow starts sending
	evHostWake                // a host's pacer may let a packet go
	evTxDone                  // a port finished serialising a packet
	evArrive                  // a packet reaches the node at the far end of a link
	evRPTimer                 // a flow's reaction point has a deadline
	evNPTimer                 // a flow's notification point has a deferred CNP
	evPFC                     // a PFC PAUSE (aux 1) or RESUME (aux 0) reaches a port
	evSample                  // the sampler records queues and rates
)

// event is a value type: the heap holds events inline, so scheduling one
// allocates nothing once the heap has grown to its working size.
type event struct {
	at   clock.Time
	seq  uint64 // tie-break: events at one instant fire in scheduling order
	kind evKind
	obj  int32 // flow, node or port index, by kind
	pkt  int32 // packet index for evArrive
	aux  int32 // ingress port for evArrive, on/off for evPFC
	next int32 // the event wheel's bucket link
}

func (a *event) before(b *event) bool {
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

// eventHeap is a binary min-heap on (at, seq), for the events beyond the
// event wheel's horizon. (at, seq) is a total order, so the firing order —
// and hence every trace — is independent of queue internals, Go versions
// and GOMAXPROCS.
type eventHeap struct {
	ev []event
}

// push adds e, whose seq the caller has set.
func (h *eventHeap) push(e event) {
	h.ev = append(h.ev, e)
	i := len(h.ev) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.ev[i].before(&h.ev[p]) {
			break
		}
		h.ev[i], h.ev[p] = h.ev[p], h.ev[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	top := h.ev[0]
	n := len(h.ev) - 1
	h.ev[0] = h.ev[n]
	h.ev = h.ev[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.ev[r].before(&h.ev[l]) {
			m = r
		}
		if !h.ev[m].before(&h.ev[i]) {
			break
		}
		h.ev[i], h.ev[m] = h.ev[m], h.ev[i]
		i = m
	}
	return top
}

func (h *eventHeap) len() int { return len(h.ev) }
