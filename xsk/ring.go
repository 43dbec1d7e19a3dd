package xsk

import (
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ring is the shared part of the four single-producer single-consumer rings
// the kernel maps into our address space.
//
// producer and consumer point into the mapping and are shared with the
// kernel: they are read with an atomic load (acquire) and written with an
// atomic store (release) so that the descriptor writes before a store are
// visible to the kernel before the index moves, and our reads of descriptors
// happen after we saw the index that published them. Go's sync/atomic is
// sequentially consistent, which is at least acquire/release.
//
// cachedProducer and cachedConsumer are our private copies; the shared cache
// line is touched once per batch, not once per descriptor (as libxdp does).
// On a producer ring (FILL, TX) cachedConsumer is kept size ahead of the
// real consumer, so the free space is one subtraction.
type ring struct {
	producer *atomic.Uint32
	consumer *atomic.Uint32
	flags    *atomic.Uint32
	mask     uint32
	size     uint32

	cachedProducer uint32
	cachedConsumer uint32

	mem []byte // the mapping, for Munmap
}

// needWakeup reports whether the kernel asked to be kicked (XDP_USE_NEED_WAKEUP).
func (r *ring) needWakeup() bool {
	return r.flags.Load()&unix.XDP_RING_NEED_WAKEUP != 0
}

// free returns how many entries a producer may write, refreshing the cached
// consumer from the shared index only when the cache says fewer than want.
func (r *ring) free(want uint32) uint32 {
	n := r.cachedConsumer - r.cachedProducer
	if n >= want {
		return n
	}
	r.cachedConsumer = r.consumer.Load() + r.size
	return r.cachedConsumer - r.cachedProducer
}

// available returns how many entries a consumer may read, refreshing the
// cached producer only when the cache says fewer than want.
func (r *ring) available(want uint32) uint32 {
	n := r.cachedProducer - r.cachedConsumer
	if n >= want {
		return n
	}
	r.cachedProducer = r.producer.Load()
	return r.cachedProducer - r.cachedConsumer
}

// addrRing is a FILL or COMPLETION ring: entries are UMEM addresses.
type addrRing struct {
	ring
	addrs []uint64
}

// descRing is an RX or TX ring: entries are descriptors.
type descRing struct {
	ring
	descs []unix.XDPDesc
}
