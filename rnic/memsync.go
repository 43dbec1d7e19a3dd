package rnic

// WithLock runs fn while holding q's lock: the lock under which the engine
// lets q's transport write memory (a peer's RDMA WRITE landing in an MR, a
// READ response or an atomic result being copied in) and read it (the
// payload of a SEND or WRITE being segmented, possibly again for a
// retransmission). An application that watches memory for a peer's WRITE
// without a completion to tell it (perftest's write_lat polls the last
// byte of the message), or that changes a buffer an unacknowledged WRITE
// may still be resent from, does so in fn: it then sees each packet's
// bytes whole, and the race detector sees the order.
//
// fn must be short and must not call q's verbs (it would deadlock).
func (q *QP) WithLock(fn func()) {
	q.mu.Lock()
	defer q.release()
	fn()
}
