package port

import (
	"time"

	"golang.org/x/sys/unix"
)

// Yield gives the calling thread's CPU to another runnable thread, if one
// waits for it (sched_yield(2)); with none, it returns at once. The
// engine's idle spin calls it (engine.Options.Yield).
//
// It is a raw system call: the Go scheduler is not told, as sched_yield
// waits for no event. Told, its monitor finds a thread whose yield handed
// the CPU over still in the call and, with no idle P (GOMAXPROCS 1: a
// process limited to one CPU), wakes another thread to take the P and
// keeps watching every 20 µs: wake-ups on the very CPU the yield gave
// away.
func Yield() { _, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) } // it cannot fail on Linux

// Nap sleeps the calling thread for about d (nanosleep(2)): the engine
// naps so while frames stream in (engine.Options.Nap), shorter than a Go
// timer can (a millisecond's resolution here).
func Nap(d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	_ = unix.Nanosleep(&ts, nil) // EINTR: a shorter nap does no harm
}
