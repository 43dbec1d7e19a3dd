package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/icrc"
	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/rnic"
)

// Options tune the loop. The zero value is the tuned default.
type Options struct {
	// Tap, if set, is offered every batch received and sent (one atomic
	// load per batch while no capture runs).
	Tap *capture.Tap
	// Batch is the receive and transmit batch (0: port.BatchSize).
	Batch int
	// SpinFor is how long Run keeps polling without sleeping after the
	// last work it did (0: 2 µs), at least. Spinning long regardless of
	// the traffic starves the application and the peer on a small
	// machine (README, "Design decisions"). SpinMax lets the window grow
	// where the traffic needs it.
	SpinFor time.Duration
	// SpinMax bounds the adaptive spin window (0: 200 µs; negative: no
	// adaptation, Run spins SpinFor). While no application polls the
	// device, the window grows towards SpinMax while work comes sooner
	// than SpinMax after the last, or finds frames queued up, and shrinks
	// back to SpinFor while it comes later: see spinPolicy for why.
	SpinMax time.Duration
	// IdleWait is how long Run naps at a time once it stops spinning
	// (0: 10 µs): a post (the device's doorbell) ends a nap at once, a
	// frame is seen at the next poll of the port, at most IdleWait later.
	IdleWait time.Duration
	// DeepIdleAfter is how long without work before Run sleeps in the
	// port's Recv instead of napping (0: 10 ms). Only a frame wakes that
	// sleep (AF_XDP's poll(2) rounds it up to the millisecond), so a post
	// after a long idle time may wait up to a millisecond; it costs no CPU.
	DeepIdleAfter time.Duration
	// PolledWait is how long Run naps at a time while an application
	// drives the device itself through rnic.Device.Poll (polled within
	// the last PolledWait; 0: 50 µs). Such an application receives and
	// sends in its own goroutine, so the engine goroutine only covers for
	// it if it stops polling: waking every IdleWait would take CPU from
	// the poller and, on a small machine, from the peer. A post made just
	// after a Poll does not ring the doorbell (the poller sends it), so
	// this also bounds the delay of a post whose poster then stops polling.
	PolledWait time.Duration
	// EagerTx makes every step build frames right after receiving,
	// instead of leaving that to the next step when the step received
	// something (see Step). For measurements.
	EagerTx bool
	// Yield, if set, gives the CPU away for a moment (port.Yield:
	// sched_yield(2)). Run calls it between the polls of its idle spin,
	// and after a step that received, completed work requests and left
	// its answers to the next, while no application polls the device,
	// so that a spinning engine runs only on a CPU nothing else wants:
	// the client it has just woken, the peer's engine or an application
	// spinning on the same CPU run first, and with nothing else runnable
	// the call returns at once. On a small host a spin that does not
	// yield holds the CPU that the thread producing its next work needs
	// (README, "Design decisions").
	Yield func()
	// Nap, if set, sleeps the calling thread for about d (port.Nap:
	// nanosleep(2)). While frames stream in (StreamFrames or more in a
	// StreamWindow), Run naps StreamNap instead of yielding between idle
	// polls: the frames queue up in the port meanwhile and the next step
	// takes them in one batch, where a yielding spin holds a CPU the
	// sender (whose system call delivers the frames, on a small host)
	// needs. A ping-pong receives too few frames to nap.
	Nap func(d time.Duration)
	// Now is the clock (nil: clock.Now). Tests pass a virtual clock.
	Now func() clock.Time
	// Gauge reads the port's receive rings for the device's host
	// congestion signal (rnic.Device.SetRxLevel) after every Recv that
	// returned frames. Nil: the port, if it is a port.RxGauge (a port
	// wrapped by Config.WrapPort of host is not: host passes the one
	// underneath).
	Gauge port.RxGauge
}

func (o *Options) defaults() {
	if o.Batch <= 0 {
		o.Batch = port.BatchSize
	}
	if o.SpinFor <= 0 {
		o.SpinFor = 2 * time.Microsecond
	}
	if o.SpinMax == 0 {
		o.SpinMax = 200 * time.Microsecond
	}
	if o.IdleWait <= 0 {
		o.IdleWait = 10 * time.Microsecond
	}
	if o.DeepIdleAfter <= 0 {
		o.DeepIdleAfter = 10 * time.Millisecond
	}
	if o.PolledWait <= 0 {
		o.PolledWait = 50 * time.Microsecond
	}
	if o.Now == nil {
		o.Now = clock.Now
	}
}

// Counters are what the loop itself did. Frame-level counts (received,
// dropped and why, built) are the device's, in rnic.Device.Stats.
type Counters struct {
	Loops       uint64 // loop iterations (Step calls)
	Naps        uint64 // naps taken while idle
	TxSent      uint64 // frames the port took
	TxBackPress uint64 // Submit calls in which the port took fewer frames than offered
	Polls       uint64 // steps run by an application through rnic.Device.Poll
	PollsBusy   uint64 // Polls that found the step taken by another goroutine
	// NapsYielded counts naps the loop took again because an application
	// was stepping when the previous one ended.
	NapsYielded uint64
	// SpinWindowNs is Run's adaptive spin window now, in ns (Options.SpinMax).
	SpinWindowNs uint64
	// Yields counts the CPU given away (Options.Yield).
	Yields uint64
	// StreamNaps counts the naps taken instead of yields while frames
	// streamed in (Options.Nap).
	StreamNaps uint64
}

// Loop is the state of one engine: the device, the port and the frame
// buffers, all allocated by NewLoop. Run creates one; tests and the
// simulator create their own and call Step with virtual time.
type Loop struct {
	dev  *rnic.Device
	port port.Port
	opt  Options

	in [][]byte
	// out[:lent] are buffers the port lent: out[:pend] hold frames the
	// port has not taken yet, in order, out[pend:lent] are free for the
	// device to build frames in (kept from step to step).
	out        [][]byte
	pend, lent int
	// stuck: the last Submit took none of pend frames, or the device had
	// frames to send and the port lent no buffer. The peer (or the
	// kernel's ring) is not draining: polling again at once only takes
	// the CPU it needs, so the loop naps as if idle.
	stuck bool
	// txDeferred: the last step received frames and built none; the next
	// one builds whatever it receives.
	txDeferred bool
	lastRecv   int // frames the last Step received
	// The frames received since streamFrom; streaming: the window
	// before it had StreamFrames of them (Options.Nap).
	streamFrom   clock.Time
	streamFrames int
	streamBatch  bool // a Step in the window received StreamFrames at once
	streaming    bool
	polledAt     clock.Time // when the last Step polled the port

	loops, naps, txSent, txBack atomic.Uint64
	polls, pollsBusy            atomic.Uint64
	napsYielded, yields         atomic.Uint64
	streamNaps                  atomic.Uint64
	spinWindow                  atomic.Int64 // Run's adaptive spin window, for Counters

	// wake wakes the port from a deep sleep (port.Waker), nil if it
	// cannot be woken.
	wake func()

	// stepMu is held by whichever goroutine runs the device's step
	// functions under Run: the engine goroutine (always, except while it
	// naps) or an application in TryStep. running says Run is still
	// running; it changes under stepMu.
	stepMu  sync.Mutex
	running atomic.Bool
}

// NewLoop prepares an engine for dev on p.
func NewLoop(dev *rnic.Device, p port.Port, opt Options) (*Loop, error) {
	if dev == nil || p == nil {
		return nil, errors.New("engine: no device or no port")
	}
	opt.defaults()
	mf := p.MaxFrame()
	if need := minFrame(dev.Config().PortMTU); mf < need {
		return nil, fmt.Errorf("engine: port frames of %d bytes cannot hold a %d-byte MTU packet (%d bytes)", mf, dev.Config().PortMTU, need)
	}
	if opt.Gauge == nil {
		opt.Gauge, _ = p.(port.RxGauge)
	}
	l := &Loop{dev: dev, port: p, opt: opt, in: make([][]byte, opt.Batch), out: make([][]byte, opt.Batch)}
	if w, ok := p.(port.Waker); ok {
		l.wake = func() { _ = w.Wake() } // fails only once the port is closed
	}
	return l, nil
}

// minFrame is the room rnic.Device.Transmit needs in a buffer to build a
// frame for a QP with path MTU mtu: Ethernet, IPv6, UDP, the longest BTH
// and extension headers, the payload, pad and ICRC. With less, the device
// would build nothing and the QP would never send.
func minFrame(mtu int) int {
	return frame.EthernetLen + frame.IPv6Len + frame.UDPLen + bth.MaxHeaderLen + mtu + 3 + icrc.Len
}

// Device is the device the loop drives.
func (l *Loop) Device() *rnic.Device { return l.dev }

// Counters returns the loop's counters (safe from any goroutine).
func (l *Loop) Counters() Counters {
	return Counters{Loops: l.loops.Load(), Naps: l.naps.Load(), TxSent: l.txSent.Load(), TxBackPress: l.txBack.Load(),
		Polls: l.polls.Load(), PollsBusy: l.pollsBusy.Load(), NapsYielded: l.napsYielded.Load(),
		SpinWindowNs: uint64(l.spinWindow.Load()), Yields: l.yields.Load(), StreamNaps: l.streamNaps.Load()}
}

// DeviceStats returns a copy of the device's counters as of the last loop
// iteration (safe from any goroutine, unlike reading Device.Stats while
// the loop runs).
func (l *Loop) DeviceStats() rnic.Stats { return l.dev.StatsSnapshot() }

// Step runs one loop iteration at time now: receive one batch (waiting at
// most wait for its first frame), run the device's due timers, and offer
// the port what it did not take last time topped up with new frames. It
// reports whether anything was received, built or sent.
//
// A step that received frames builds none (it still sends what the port
// did not take): the next step does, whatever it receives. The ACKs the
// batch asked for then leave with what the application posts in reply
// (in a ping-pong, the responder's SEND follows the ACK of the request
// within a microsecond, and one sendto(2) per half round trip is saved
// on AF_XDP's copy mode, where that call delivers the frames to the peer
// before it returns), and consecutive AckReqs of a burst coalesce into
// one ACK. It costs one extra poll of the port before a reply, and a
// burst still gets a transmit at least every second step. The caller owns
// the loop (Run and TryStep take the step lock; tests and the simulator
// call Step from their one goroutine).
func (l *Loop) Step(now clock.Time, wait time.Duration) (bool, error) {
	l.loops.Add(1)
	n, err := l.port.Recv(l.in, wait)
	l.lastRecv = n
	if err != nil {
		return false, err
	}
	if wait > 0 {
		now = l.opt.Now() // the wait may have been long
	}
	// How long the frames may have waited in the port: since the last
	// poll, unless they woke a wait in it.
	away := time.Duration(0)
	if wait == 0 && l.polledAt != 0 && now > l.polledAt {
		away = now.Sub(l.polledAt)
	}
	l.receive(now, n, away)
	// A full batch may have more behind it: take it (a bounded number of
	// batches) before the timers run. After the loop was away for a while
	// (descheduled on a loaded host) the answers a QP waits for may sit
	// in the ring behind other QPs' frames, and its timer must not fire
	// as if they never came.
	for k := 1; n == len(l.in) && k < maxDrainBatches; k++ {
		if n, err = l.port.Recv(l.in, 0); err != nil {
			return false, err
		}
		l.lastRecv += n
		l.receive(now, n, away) // queued no longer than the first batch
	}
	l.polledAt = now
	l.dev.Expire(now)
	fetched := l.dev.FetchQueues(now)
	built := 0
	got := l.lastRecv
	l.streamFrames += got
	l.streamBatch = l.streamBatch || got >= StreamFrames
	starved := false // the device has frames to send and the port no buffer
	if got > 0 && !l.txDeferred && !l.opt.EagerTx {
		l.txDeferred = true
	} else if l.txDeferred = false; l.pend < len(l.out) && l.dev.HasOutput() {
		if l.lent < len(l.out) {
			l.lent += l.port.Lend(l.out[l.lent:])
		}
		built = l.dev.Transmit(now, l.out[l.pend:l.lent])
		if built > 0 && l.opt.Tap != nil {
			if s := l.opt.Tap.Session(); s != nil {
				s.Frames(capture.Out, l.out[l.pend:l.pend+built])
			}
		}
		l.pend += built
		starved = l.pend == l.lent && l.dev.HasOutput()
	}
	sent := 0
	if l.pend > 0 {
		sent, err = l.port.Submit(l.out[:l.pend])
		l.txSent.Add(uint64(sent))
		if sent < l.pend {
			// The device considers these frames sent: they stay, in
			// order, at the front, to be submitted again.
			l.txBack.Add(1)
		}
		// out[:sent] are the port's again; what is still lent moves up.
		m := copy(l.out, l.out[sent:l.lent])
		clear(l.out[m:l.lent])
		l.pend -= sent
		l.lent = m
	}
	l.stuck = l.pend > 0 && sent == 0 || starved
	l.dev.PublishStats()
	return got > 0 || fetched || built > 0 || sent > 0, err
}

// Receiving StreamFrames or more frames in a StreamWindow counts as a
// stream (Options.Nap): 80 000 frames a second, where a ping-pong's
// round trip brings one or two. StreamNap is the nap then.
const (
	StreamFrames = 4
	StreamWindow = 50 * time.Microsecond
	StreamNap    = 20 * time.Microsecond
)

// streamingAt reports whether frames stream in, as of the window that
// ended last before now: at least StreamFrames per StreamWindow over it
// (a loop kept away longer measures a longer window) or in one Step's
// batch, or, once streaming, any frame in a window of normal length (a
// sender's pause).
func (l *Loop) streamingAt(now clock.Time) bool {
	if el := now.Sub(l.streamFrom); el >= StreamWindow {
		dense := l.streamBatch || time.Duration(l.streamFrames)*StreamWindow >= StreamFrames*el
		l.streaming = dense || l.streaming && l.streamFrames > 0 && el < 2*StreamWindow
		l.streamFrom, l.streamFrames, l.streamBatch = now, 0, false
	}
	return l.streaming
}

// maxDrainBatches bounds the batches one Step receives before it runs the
// device's timers.
const maxDrainBatches = 16

// receive hands the n frames of the last Recv to the device, which may
// have waited in the port for away.
func (l *Loop) receive(now clock.Time, n int, away time.Duration) {
	if n == 0 {
		return
	}
	if l.opt.Tap != nil {
		if s := l.opt.Tap.Session(); s != nil {
			s.Frames(capture.In, l.in[:n])
		}
	}
	if l.opt.Gauge != nil {
		fill, queued, buffers := l.opt.Gauge.RxLevel()
		l.dev.SetRxLevel(now, fill, queued, buffers)
	}
	l.dev.SetRxAway(away)
	l.dev.Receive(now, l.in[:n])
	clear(l.in[:n]) // the port's views expire with the next Recv
}

// TryStep runs one Step in the calling goroutine at the current time if
// Run is running and no other goroutine holds the step (the engine
// goroutine between naps, or another poller); it never waits. It reports
// whether the step moved anything. Run installs it as the device's poller
// (rnic.Device.Poll). A port error is left for Run, which meets it on
// its next step and returns it.
func (l *Loop) TryStep() bool {
	moved, _ := l.tryStep()
	return moved
}

// tryStep is TryStep reporting also whether it ran a step: the poller
// Run installs (rnic.Device.SetPoller).
func (l *Loop) tryStep() (moved, ran bool) {
	if !l.stepMu.TryLock() {
		l.pollsBusy.Add(1)
		return false, false
	}
	defer l.stepMu.Unlock()
	if !l.running.Load() {
		return false, false
	}
	l.polls.Add(1)
	worked, _ := l.Step(l.opt.Now(), 0)
	return worked, true
}

// nap sleeps for d at most, until the doorbell rings or done closes.
func (l *Loop) nap(timer *time.Timer, d time.Duration, bell <-chan struct{}, done <-chan struct{}) {
	timer.Reset(d)
	select {
	case <-bell:
	case <-timer.C:
	case <-done:
	}
	timer.Stop()
}

// Run drives dev on p until ctx ends (nil) or the port fails (its error).
// It is the one goroutine that calls dev's step functions and owns p.
func Run(ctx context.Context, dev *rnic.Device, p port.Port, opt Options) error {
	l, err := NewLoop(dev, p, opt)
	if err != nil {
		return err
	}
	return l.Run(ctx)
}

// Run is the loop of Run on a prepared Loop.
//
// Idle policy: after work it keeps polling for SpinFor; then it naps for
// IdleWait at a time (or until the next timer deadline, if sooner) on a
// timer that the device's doorbell cuts short, polling the port between
// naps; after DeepIdleAfter without work it sleeps in the port itself. A
// port that takes none of the frames offered counts as no work: spinning
// on a full ring would only starve the peer that drains it.
//
// While an application polls the device (rnic.Device.Poll within the
// last PolledWait) the naps last PolledWait and the loop never sleeps in
// the port, where it would hold the step lock and shut the poller out.
// With outside queues attached (rnic.Queues: the daemon's client rings,
// which no application polls through the device) and a port that can be
// woken, the loop sleeps in the port as soon as its spin window ends: a
// frame wakes it there at once, where a nap ends up to a Go timer's
// millisecond later.
//
// Run holds the step lock except while it naps; before it returns, it
// removes its poller and waits for a running TryStep to finish.
func (l *Loop) Run(ctx context.Context) error {
	now := l.opt.Now
	lastWork := now()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	done := ctx.Done()
	bell := l.dev.Doorbell()
	l.stepMu.Lock()
	l.running.Store(true)
	l.dev.SetPoller(l.tryStep)
	if l.wake != nil {
		l.dev.SetWaker(l.wake)
	}
	defer func() {
		l.dev.SetWaker(nil)
		l.dev.SetPoller(nil)
		l.running.Store(false)
		l.stepMu.Unlock()
	}()
	adaptive := spinPolicy{min: l.opt.SpinFor, max: l.opt.SpinMax}
	l.spinWindow.Store(int64(adaptive.window()))
	idle := false // a step since the last work found nothing
	for ctx.Err() == nil {
		t := now()
		wait := time.Duration(0)
		spinning := true // this iteration neither naps nor sleeps
		// An application that polls steps the device itself (see
		// PolledWait): spinning here would only contend with it.
		at := l.dev.PolledAt() // 0: never polled
		polled := at != 0 && t.Sub(at) < l.opt.PolledWait
		spin := l.opt.SpinFor
		if !polled {
			spin = adaptive.window()
		}
		if t.Sub(lastWork) > spin && (l.stuck || l.pend == 0 && !l.dev.HasOutput()) {
			spinning = false
			nap := l.opt.IdleWait
			if polled {
				nap = max(nap, l.opt.PolledWait)
			}
			if dl := l.dev.NextDeadline(); dl != clock.Never {
				nap = max(0, min(nap, dl.Sub(t)))
			}
			if !polled && (t.Sub(lastWork) > l.opt.DeepIdleAfter || l.wake != nil && l.dev.HasQueues()) {
				wait = l.deepSleep(t, nap, bell)
			} else if nap > 0 && l.dev.ArmQueues() {
				l.naps.Add(1)
				l.stepMu.Unlock()
				l.nap(timer, nap, bell, done)
				// An application stepping at this moment keeps the step:
				// nap again rather than wait on the lock, whose Unlock
				// would then wake this goroutine (a futex call) in the
				// application's critical path.
				for !l.stepMu.TryLock() {
					if ctx.Err() != nil {
						l.stepMu.Lock()
						break
					}
					l.napsYielded.Add(1)
					l.nap(timer, max(nap, l.opt.PolledWait), bell, done)
				}
				l.dev.DisarmQueues()
				t = now()
			} else {
				l.dev.DisarmQueues()
			}
		}
		made := l.dev.CompletionsMade()
		worked, err := l.Step(t, wait)
		if wait > 0 {
			l.dev.SetAsleep(false)
			l.dev.DisarmQueues()
		}
		if err != nil {
			if errors.Is(err, port.ErrClosed) && ctx.Err() != nil {
				return nil
			}
			return err
		}
		if worked && l.txDeferred && !polled && l.opt.Yield != nil && l.dev.CompletionsMade() != made {
			// The step received, completed work requests and left its
			// answers to the next step (see Step). The client it
			// completed to, if it shares this CPU, can post its reply
			// meanwhile, which then leaves with the ACKs in one batch
			// instead of waiting behind their send. A step that
			// completed nothing (a WRITE stream's) does not yield.
			l.yields.Add(1)
			l.opt.Yield()
		}
		if worked {
			if idle {
				adaptive.observe(t.Sub(lastWork), l.lastRecv)
				l.spinWindow.Store(int64(adaptive.window()))
			}
			lastWork, idle = t, false
		} else {
			idle = true
			switch {
			case !spinning || polled: // it napped, or an application steps the device
			case l.opt.Nap != nil && l.streamingAt(t):
				l.streamNaps.Add(1)
				l.opt.Nap(StreamNap)
			case l.opt.Yield != nil:
				l.yields.Add(1)
				l.opt.Yield()
			}
		}
	}
	// The last step may have received requests whose ACKs it left for the
	// next one (see Step), and an application that saw their completions
	// may have stopped the loop at once: send them before leaving. The port
	// may be closing too; its error is of no interest any more.
	if l.txDeferred {
		_, _ = l.Step(now(), 0)
	}
	return nil
}

// deepSleep prepares Run's sleep in the port after DeepIdleAfter without
// work and returns how long the port may wait (0: no sleep, work came).
// A port that can be woken (port.Waker) sleeps until the next timer
// deadline, at most maxDeepSleep, and posts, Device.Wake and work in the
// device's Queues wake it: an idle engine costs nothing. Any other port
// sleeps nap*20 at a time, and a post waits for the end of that sleep.
// The device learns that the engine sleeps and the queues are armed
// before the doorbell is looked at: work that comes after the look finds
// them and wakes the port. Run says it is awake again and disarms them
// after the sleep.
func (l *Loop) deepSleep(t clock.Time, nap time.Duration, bell <-chan struct{}) time.Duration {
	wait := nap * 20
	if l.wake != nil {
		if !l.stuck { // a port that takes no frames does not wake the loop when it does
			wait = maxDeepSleep
			if dl := l.dev.NextDeadline(); dl != clock.Never {
				wait = min(wait, dl.Sub(t))
			}
		}
		l.dev.SetAsleep(true)
	}
	if !l.dev.ArmQueues() {
		wait = 0
	}
	select {
	case <-bell:
		wait = 0
	default:
	}
	if wait <= 0 {
		l.dev.SetAsleep(false)
		l.dev.DisarmQueues()
		return 0
	}
	return wait
}

// maxDeepSleep bounds a sleep in a port that can be woken: nothing should
// need it, it only limits what a lost wake-up could cost.
const maxDeepSleep = time.Second

// spinPolicy is Run's adaptive spin window (Options.SpinMax): how long to
// keep polling the port after work before napping. Spinning pays when the
// next frame comes sooner than a nap ends, and only then. A nap is a Go
// timer, and the runtime waits for timers in epoll_pwait(2), whose timeout
// is in milliseconds: in a process with nothing else running, a nap of
// microseconds lasts a millisecond. So the window adapts as an adaptive
// mutex's spin does, from the idle gaps (from the last work to the work
// that ended an idle spell) and from what that work was:
//
//   - frames that queued up while the loop was away (two or more in the
//     step that ended the spell): traffic is denser than the window
//     covered, whatever the gap (a nap's oversleep makes it long), and the
//     window doubles, up to max;
//   - otherwise a gap over the window but under max: a longer window would
//     have caught the work without a nap, and the window doubles too;
//   - otherwise a gap of max or more: spinning would not have caught it,
//     and the window halves, down to min.
//
// With a fixed short window a WRITE responder in its own process naps
// between the frames of a stream, and the requester stalls on the late
// ACKs (README, "Design decisions"). A pure function of what it observes,
// for tests.
//
// Run only spins while no application polls the device, so a ping-pong
// whose ends poll never spins here; a WRITE or READ responder, a SEND
// receiver that sleeps on its CQ, and the daemon's devices do.
type spinPolicy struct {
	min, max time.Duration // max ≤ min: no adaptation
	w        time.Duration // the window; below min: min
}

// observe records one idle gap and the frames received by the step that
// ended it.
func (p *spinPolicy) observe(gap time.Duration, frames int) {
	if p.max <= p.min {
		return
	}
	w := p.window()
	switch {
	case frames >= 2 && gap > w, gap > w && gap < p.max:
		p.w = min(2*w, p.max)
	case gap >= p.max:
		p.w = max(w/2, p.min)
	}
}

// window is how long to spin after work.
func (p *spinPolicy) window() time.Duration {
	if p.max <= p.min || p.w < p.min {
		return p.min
	}
	return p.w
}
