package daemon

import (
	"context"
	"time"

	"github.com/softrnic/softrnic/capture"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/verbs"
)

// RunOptions tune RunDevice.
type RunOptions struct {
	// Tap, if set, is offered every batch received and sent (one atomic
	// load per batch while no capture runs).
	Tap *capture.Tap
	// IdleWait bounds a sleep in the port's Recv (0: 100 µs), which is also
	// how late a post can be noticed by an idle loop: the port cannot be
	// woken by the device's doorbell.
	IdleWait time.Duration
	// SpinFor is how long the loop polls without sleeping after its last
	// work (0: 50 µs).
	SpinFor time.Duration
}

// RunDevice is the engine loop of one verbs.Device on one port.Port, until
// ctx ends or the port fails: receive a batch, hand it to the device, run
// due timers, send what the device builds. It owns the port and the
// device's step functions (one goroutine, as package verbs requires).
func RunDevice(ctx context.Context, dev *verbs.Device, p port.Port, opt RunOptions) error {
	if opt.IdleWait == 0 {
		opt.IdleWait = 100 * time.Microsecond
	}
	if opt.SpinFor == 0 {
		opt.SpinFor = 50 * time.Microsecond
	}
	in := make([][]byte, port.BatchSize)
	out := make([][]byte, port.BatchSize)
	for i := range out {
		out[i] = make([]byte, 0, p.MaxFrame())
	}
	var pending [][]byte // built, not yet taken by the port: sent first next time
	last := clock.Now()
	for ctx.Err() == nil {
		now := clock.Now()
		wait := time.Duration(0)
		if len(pending) == 0 && now.Sub(last) >= opt.SpinFor && !dev.HasOutput() {
			select {
			case <-dev.Doorbell():
			default:
				wait = min(max(dev.NextDeadline().Sub(now), 0), opt.IdleWait)
			}
		}
		n, err := p.Recv(in, wait)
		if err != nil {
			return err
		}
		now = clock.Now()
		if n > 0 {
			if opt.Tap != nil {
				if s := opt.Tap.Session(); s != nil {
					s.Frames(capture.In, in[:n])
				}
			}
			dev.Receive(now, in[:n])
			last = now
		}
		dev.Expire(now)
		if len(pending) == 0 {
			if m := dev.Transmit(now, out); m > 0 {
				pending = out[:m]
				if opt.Tap != nil {
					if s := opt.Tap.Session(); s != nil {
						s.Frames(capture.Out, pending)
					}
				}
			}
		}
		if len(pending) > 0 {
			k, err := p.Send(pending)
			if err != nil {
				return err
			}
			pending = pending[k:]
			last = now
		}
	}
	return nil
}
