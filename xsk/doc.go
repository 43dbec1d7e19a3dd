// Package xsk is softrnic's own AF_XDP socket implementation, written directly
// on golang.org/x/sys/unix.
//
// A Socket owns one UMEM (a region of frames shared with the kernel) and the
// four rings: FILL and RX carry received frames (we give the kernel empty
// frames on FILL, it hands them back filled on RX), TX and COMPLETION carry
// transmitted frames (we post filled frames on TX, the kernel returns them on
// COMPLETION once sent). The UMEM is split in two disjoint pools: frames that
// circulate between FILL and RX, and frames that circulate between a free
// stack, TX and COMPLETION, so a frame is never on two rings at once.
//
// A Socket is bound to one (interface, queue); on a multi-queue NIC open one
// Socket per queue, each with its own UMEM, and register each in the steering
// program's XSKMAP under its queue. A Socket is used by one goroutine: its
// rings are single-producer single-consumer and it holds no lock.
//
// Why not github.com/asavie/xdp (archived): its ring indexes are plain loads
// and stores shared with the kernel (a data race, wrong on weakly ordered
// CPUs); it finds free frames by scanning every frame on each receive
// (O(frames), see README's "Design decisions" for its cost) and can hand
// out a frame the application still reads; it has no need_wakeup, so every
// transmit is a syscall and an idle driver spins; and its Detach never returns
// after a generic-mode attach. Here the indexes are atomics with cached
// copies, frames are allocated from a stack in O(1) with disjoint receive and
// transmit pools, wakeups follow XDP_RING_NEED_WAKEUP, and the program is a
// BPF link that the kernel detaches when its file descriptor closes.
package xsk
