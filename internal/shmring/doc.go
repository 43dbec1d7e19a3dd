// Package shmring is a single-producer single-consumer ring of fixed-size
// slots in shared memory (a memfd mapped by two processes). The softrnic
// daemon and its clients use it for send and receive work queues and for
// completion queues, so that posting a work request and polling a completion
// are plain memory operations: no syscall in the common case.
//
// Layout of the memfd (little-endian, every index on its own cache line so
// the two sides never false-share):
//
//	0    magic u64, version u32, slot size u32, slot count u32
//	64   producer index u64   (written by the producer only)
//	128  consumer index u64   (written by the consumer only)
//	192  wakeup flag u32      (set by a consumer about to sleep: WakeAny, WakeSolicited)
//	256  slots
//
// Indexes are free-running uint64 counters; slot i is at (i & (count-1)).
// The producer publishes with an atomic store after filling slots; the
// consumer reads the index with an atomic load before reading slots (Go's
// atomics are sequentially consistent, which includes load-acquire and
// store-release). Each side keeps a cached copy of the other side's index and
// reloads it only when the ring looks full (producer) or empty (consumer), so
// that a batch costs one shared-cache-line read and one write.
//
// Wakeups: a consumer that wants to sleep sets the wakeup flag, rechecks the
// ring (Dekker-style, both sides use sequentially consistent atomics) and only
// then blocks on a Doorbell (an eventfd). A producer checks the flag after
// publishing and writes the eventfd only when it finds the flag set, clearing
// it with a swap so that one sleep costs one write. While the consumer is
// busy polling, posting costs no syscall at all. Several rings may share one
// Doorbell: a consumer serving many rings arms them all before sleeping.
// A consumer may instead wait for a solicited entry only (WakeSolicited):
// its producer then rings on a commit it marks solicited
// (CommitSolicited), which is how a CQ armed with ibv_req_notify_cq's
// solicited_only sleeps through unsolicited completions.
//
// Security: the peer may be hostile. Geometry is fixed by the mapping side's
// own arguments and checked against the header once; afterwards the header's
// geometry is never read again. Indexes read from shared memory are validated
// on every reload, and an impossible one (the peer claims more entries than
// the ring holds) latches ErrCorrupt instead of reading out of bounds. Rings
// are created sealed (F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL), and Map refuses
// a memfd that is not sealed against shrinking, so a peer cannot truncate the
// file under a mapping and fault the other process with SIGBUS.
package shmring
