package xsk

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The rings' views of the mappings the kernel shares: the indexes and the
// entries are read and written in place.

func (r *ring) init(mem []byte, off unix.XDPRingOffset, size uint32) {
	r.mem = mem
	base := unsafe.Pointer(unsafe.SliceData(mem))
	r.producer = (*atomic.Uint32)(unsafe.Add(base, off.Producer))
	r.consumer = (*atomic.Uint32)(unsafe.Add(base, off.Consumer))
	r.flags = (*atomic.Uint32)(unsafe.Add(base, off.Flags))
	r.size = size
	r.mask = size - 1
}

func (r *addrRing) init(mem []byte, off unix.XDPRingOffset, size uint32, producer bool) {
	r.ring.init(mem, off, size)
	r.addrs = unsafe.Slice((*uint64)(unsafe.Pointer(&mem[off.Desc])), size)
	r.cachedProducer = r.producer.Load()
	r.cachedConsumer = r.consumer.Load()
	if producer {
		r.cachedConsumer += size
	}
}

func (r *descRing) init(mem []byte, off unix.XDPRingOffset, size uint32, producer bool) {
	r.ring.init(mem, off, size)
	r.descs = unsafe.Slice((*unix.XDPDesc)(unsafe.Pointer(&mem[off.Desc])), size)
	r.cachedProducer = r.producer.Load()
	r.cachedConsumer = r.consumer.Load()
	if producer {
		r.cachedConsumer += size
	}
}
