package port

import "golang.org/x/sys/unix"

// Yield gives the calling thread's CPU to another runnable thread, if one
// waits for it (sched_yield(2)); with none, it returns at once. The
// engine's idle spin calls it (engine.Options.Yield).
func Yield() { _, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) } // it cannot fail on Linux
