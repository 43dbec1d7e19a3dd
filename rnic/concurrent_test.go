package rnic

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// TestConcurrentApplications runs the step functions of both devices in
// one goroutine (as an engine does) while several application
// goroutines post sends and receives and wait on their CQs: the contract
// of the package doc, checked by the race detector.
func TestConcurrentApplications(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{Loss: 0.01, Duplicate: 0.01, Reorder: 0.01}, 11, 1024)
	const apps, msgs, size = 4, 200, 3000
	type app struct {
		qa, qb   *QP
		src, dst *MR
	}
	var as []app
	for i := 0; i < apps; i++ {
		qa, qb := tb.connect(ib.RC, 1024, ib.LocalWrite, 32)
		src, _ := tb.a.pd.RegBytes(make([]byte, msgs*size), 0, ib.LocalWrite)
		pattern(src.Bytes(), uint64(i))
		dst, _ := tb.b.pd.RegBytes(make([]byte, msgs*size), 0, ib.LocalWrite)
		as = append(as, app{qa, qb, src, dst})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stop := make(chan struct{})
	engineDone := make(chan struct{})
	go func() { // the engine: both devices, the link, virtual time
		defer close(engineDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			before := tb.bytes
			if tb.step() {
				tb.clk.Advance(time.Duration(float64(tb.bytes-before)*nsPerByte) + 1)
				continue
			}
			next := clock.Min(clock.Min(tb.a.port.NextDelivery(), tb.b.port.NextDelivery()),
				clock.Min(tb.a.dev.NextDeadline(), tb.b.dev.NextDeadline()))
			if next != clock.Never && next > tb.clk.Now() {
				tb.clk.Set(next)
				continue
			}
			select { // idle: wait for a post
			case <-tb.a.dev.Doorbell():
			case <-tb.b.dev.Doorbell():
			case <-time.After(time.Millisecond):
			case <-stop:
				return
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan string, 2*apps)
	for i := range as {
		a := as[i]
		wg.Add(2)
		go func() { // receiver application
			defer wg.Done()
			wcs := make([]ib.WC, 16)
			posted, got := 0, 0
			for got < msgs {
				for posted < msgs && posted-got < 16 {
					if _, err := a.qb.PostRecv([]verbs.RecvWR{{ID: uint64(posted), SG: []ib.SGE{{Addr: a.dst.IOVA() + uint64(posted*size), Length: size, LKey: a.dst.LKey()}}}}); err != nil {
						errs <- err.Error()
						return
					}
					posted++
				}
				n, err := a.qb.init.RecvCQ.PollWait(ctx, wcs)
				if err != nil {
					errs <- "receiver: " + err.Error()
					return
				}
				for _, c := range wcs[:n] {
					if c.Status != ib.Success || c.ID != uint64(got) {
						errs <- "bad receive completion"
						return
					}
					got++
				}
			}
		}()
		go func() { // sender application
			defer wg.Done()
			wcs := make([]ib.WC, 16)
			posted, done := 0, 0
			for done < msgs {
				for posted < msgs && posted-done < 16 {
					if _, err := a.qa.PostSend([]verbs.SendWR{{ID: uint64(posted), Opcode: ib.Send, Flags: ib.Signaled,
						SG: []ib.SGE{{Addr: a.src.IOVA() + uint64(posted*size), Length: size, LKey: a.src.LKey()}}}}); err != nil {
						errs <- err.Error()
						return
					}
					posted++
				}
				n, err := a.qa.init.SendCQ.PollWait(ctx, wcs)
				if err != nil {
					errs <- "sender: " + err.Error()
					return
				}
				for _, c := range wcs[:n] {
					if c.Status != ib.Success {
						errs <- "send completion " + c.Status.String()
						return
					}
					done++
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-engineDone
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	for _, a := range as {
		if !bytes.Equal(a.src.Bytes(), a.dst.Bytes()) {
			t.Fatal("data differs")
		}
	}
}
