package rnic

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// CQ is a completion queue.
//
// A CQ that is full when a completion arrives is overrun. As on an IBA
// RNIC (and rxe), that is an error, never a silent drop: the CQ enters
// the error state (Err reports ErrCQOverrun, Wait returns it once the
// completions queued before the overrun have been polled), the device
// counts it (CQOverruns) and reports EventCQErr, and every QP using the
// CQ moves to ERR (EventQPFatal) so that its peer and its application stop
// instead of waiting for a completion that was lost. Completions already
// queued stay valid and can be polled; later ones are counted (Overflows)
// and discarded. An application avoids this by sizing its CQ for every
// WR it may have outstanding on the QPs that share it.
type CQ struct {
	dev      *Device
	mu       sync.Mutex
	ring     []ib.WC
	head, n  int
	sink     CQSink // instead of ring (CreateCQSink)
	dead     bool   // a destroyed sink CQ: completions are dropped
	overflow uint64
	notify   chan struct{}
	// overrun is set once, under mu, and read without it by the QPs
	// using the CQ (QP.unlock), which then move to ERR.
	overrun atomic.Bool
}

var _ verbs.CQ = (*CQ)(nil)

// CreateCQ creates a CQ holding up to depth completions (ibv_create_cq).
func (d *Device) CreateCQ(depth int) (verbs.CQ, error) {
	if depth < 1 || depth > MaxCQE {
		return nil, fmt.Errorf("rnic: CQ of %d entries (1 to %d): %w", depth, MaxCQE, verbs.ErrInvalid)
	}
	return &CQ{dev: d, ring: make([]ib.WC, depth), notify: make(chan struct{}, 1)}, nil
}

// CQSink is where a CQ made by CreateCQSink delivers its completions
// instead of keeping them: the daemon's client CQ ring in shared memory,
// which the client polls itself, as an application polls the CQ a
// hardware RNIC writes. The CQ calls it under its lock.
type CQSink interface {
	// Put stores one completion, unpublished; false when the sink is
	// full (the CQ is then overrun, see CQ).
	Put(wc *ib.WC) bool
	// Publish makes what Put stored visible to the sink's reader (and
	// wakes the reader if it sleeps).
	Publish()
}

// CreateCQSink creates a CQ of depth entries whose completions go to s
// (CQSink): its Poll, Wait and PollWait find nothing, its reader polls s.
// It overflows when s is full, with the consequences of any overrun.
func (d *Device) CreateCQSink(depth int, s CQSink) (*CQ, error) {
	if depth < 1 || depth > MaxCQE || s == nil {
		return nil, fmt.Errorf("rnic: CQ of %d entries (1 to %d) with a sink: %w", depth, MaxCQE, verbs.ErrInvalid)
	}
	return &CQ{dev: d, sink: s, notify: make(chan struct{}, 1)}, nil
}

// Destroy destroys the CQ; the QPs using it must be destroyed first
// (ibv_destroy_cq). Its memory goes with its last reference. A sink
// (CreateCQSink) is detached: once Destroy returns, no completion reaches
// it, and its owner may release it.
func (c *CQ) Destroy() error {
	c.mu.Lock()
	c.dead = c.sink != nil
	c.mu.Unlock()
	return nil
}

// Poll moves up to len(out) completions into out, oldest first, and
// returns how many. After an overrun it still returns the completions
// queued before it; Err tells the application that others were lost.
func (c *CQ) Poll(out []ib.WC) int {
	c.mu.Lock()
	k := 0
	for k < len(out) && c.n > 0 {
		out[k] = c.ring[c.head]
		c.head = (c.head + 1) % len(c.ring)
		c.n--
		k++
	}
	c.mu.Unlock()
	return k
}

// Err is ErrCQOverrun once the CQ has overflowed, nil before.
func (c *CQ) Err() error {
	if c.overrun.Load() {
		return verbs.ErrCQOverrun
	}
	return nil
}

// Notify returns a channel that receives a value whenever completions
// arrive (a coalescing doorbell: one value may stand for many), and when
// the CQ is overrun.
func (c *CQ) Notify() <-chan struct{} { return c.notify }

// Wait sleeps until the CQ may hold a completion or timeout passes
// (negative: no limit); a CQ in error returns ErrCQOverrun at once.
func (c *CQ) Wait(timeout time.Duration) error {
	if err := c.Err(); err != nil {
		return err
	}
	if timeout < 0 {
		<-c.notify
		return nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-c.notify:
	case <-t.C:
	}
	return nil
}

// PollWait polls, blocking until at least one completion is there or ctx
// ends. A CQ in error returns ErrCQOverrun once its queued completions are
// polled, rather than blocking for completions that will never come.
func (c *CQ) PollWait(ctx context.Context, out []ib.WC) (int, error) {
	for {
		if n := c.Poll(out); n > 0 {
			return n, nil
		}
		if err := c.Err(); err != nil {
			return 0, err
		}
		select {
		case <-c.notify:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Overflows counts completions lost because the CQ was full or already in
// error (each one is part of an overrun, see CQ).
func (c *CQ) Overflows() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.overflow
}

// push appends the completions of wcs whose IsRecv equals recv. The first
// one that finds the CQ full puts it in error (see CQ) and reports it.
func (c *CQ) push(wcs []ib.WC, recv bool) {
	if c.dev != nil && len(wcs) > 0 {
		// Before the application can see them (dma.go's read-ahead).
		c.dev.completions.Add(1)
	}
	added, overran := false, false
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return
	}
	sink := c.sink
	for i := range wcs {
		if wcs[i].IsRecv != recv {
			continue
		}
		if c.overrun.Load() || (sink == nil && c.n == len(c.ring)) || (sink != nil && !sink.Put(&wcs[i])) {
			c.overflow++
			if !c.overrun.Load() {
				c.overrun.Store(true)
				overran = true
			}
			continue
		}
		added = true
		if sink == nil {
			c.ring[(c.head+c.n)%len(c.ring)] = wcs[i]
			c.n++
		}
	}
	if added && sink != nil {
		sink.Publish()
	}
	c.mu.Unlock()
	if overran && c.dev != nil {
		c.dev.cqOverrun(c)
	}
	if (added || overran) && sink == nil {
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
}

// CompletionsMade counts the CQ pushes that may have added a completion
// (safe from any goroutine): the engine compares it across a step to
// learn whether the step completed anything.
func (d *Device) CompletionsMade() uint64 { return d.completions.Load() }

// CQOverruns counts the CQs of the device that overflowed (safe from any
// goroutine).
func (d *Device) CQOverruns() uint64 { return d.cqOverruns.Load() }

// cqOverrun reports c's overrun (EventCQErr) and hands every QP using c to
// the engine, whose next visit (QP.unlock) moves it to ERR; the QP whose
// completion overran c is moved there by the same unlock that pushed it.
// It may run under that QP's lock: it takes no QP lock itself.
func (d *Device) cqOverrun(c *CQ) {
	d.cqOverruns.Add(1)
	d.asyncEvent(verbs.AsyncEvent{Type: ib.EventCQErr, CQ: c})
	d.qps.each(func(q *QP) {
		if q.init.SendCQ != c && q.init.RecvCQ != c || q.destroyed.Load() {
			return
		}
		if q.queued.CompareAndSwap(false, true) {
			d.handOver(q, true, false)
		}
	})
	d.ring()
}
