package shmring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

const (
	magic   = 0x31474e4952534d53 // "SMSRING1" little-endian
	version = 1

	offMagic    = 0
	offVersion  = 8
	offSlotSize = 12
	offSlots    = 16
	offProd     = 64
	offCons     = 128
	offWakeup   = 192

	// HeaderSize is the bytes before the first slot.
	HeaderSize = 256

	// MaxSlots bounds a ring so that a geometry from a message can never make
	// the mapping overflow.
	MaxSlots = 1 << 20
	// MaxSlotSize bounds one slot (a work request with many SGEs or inline data).
	MaxSlotSize = 1 << 16
)

var (
	// ErrCorrupt is latched when the peer published an index that cannot be
	// right (more entries than slots, or moving backwards). The ring is unusable
	// afterwards; its owner treats it as a fatal error of the queue.
	ErrCorrupt = errors.New("shmring: peer published an impossible index")
	// ErrGeometry is returned for a slot size or count the package refuses.
	ErrGeometry = errors.New("shmring: bad geometry")
)

// Geometry is the shape of a ring: Slots slots of SlotSize bytes each.
// Slots is a power of two; SlotSize is a positive multiple of 8.
type Geometry struct {
	SlotSize int
	Slots    int
}

// Validate reports whether g is a shape this package accepts.
func (g Geometry) Validate() error {
	if g.Slots <= 0 || g.Slots > MaxSlots || bits.OnesCount(uint(g.Slots)) != 1 {
		return fmt.Errorf("%w: slot count %d is not a power of two in [1, %d]", ErrGeometry, g.Slots, MaxSlots)
	}
	if g.SlotSize <= 0 || g.SlotSize > MaxSlotSize || g.SlotSize%8 != 0 {
		return fmt.Errorf("%w: slot size %d is not a multiple of 8 in [8, %d]", ErrGeometry, g.SlotSize, MaxSlotSize)
	}
	return nil
}

// Size is the byte size of the memfd holding a ring of shape g, rounded up to
// whole pages.
func (g Geometry) Size() int {
	n := HeaderSize + g.SlotSize*g.Slots
	pg := unix.Getpagesize()
	return (n + pg - 1) / pg * pg
}

// Ring is one process's mapping of a ring. It is not used directly for data:
// take its Producer or Consumer side (exactly one process takes each).
type Ring struct {
	fd     int
	mem    []byte
	g      Geometry
	prod   *atomic.Uint64
	cons   *atomic.Uint64
	wakeup *atomic.Uint32
	slots  []byte
}

// Create makes a new ring in a fresh memfd named name (the name only shows in
// /proc/PID/fd), seals its size and maps it. The fd is close-on-exec; pass it
// to the peer with SCM_RIGHTS (or exec.Cmd.ExtraFiles).
func Create(name string, g Geometry) (*Ring, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("shmring: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(g.Size())); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shmring: ftruncate: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shmring: seal: %w", err)
	}
	r, err := mapFD(fd, g)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	binary.LittleEndian.PutUint64(r.mem[offMagic:], magic)
	binary.LittleEndian.PutUint32(r.mem[offVersion:], version)
	binary.LittleEndian.PutUint32(r.mem[offSlotSize:], uint32(g.SlotSize))
	binary.LittleEndian.PutUint32(r.mem[offSlots:], uint32(g.Slots))
	return r, nil
}

// Map maps a ring created by a peer, from an fd received over a socket. The
// caller states the geometry it agreed on with the peer; Map checks the file
// (size, seals) and header against it and takes ownership of fd (closed by
// Close, or at once on error).
func Map(fd int, g Geometry) (*Ring, error) {
	if err := g.Validate(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := CheckSealed(fd, int64(g.Size())); err != nil {
		unix.Close(fd)
		return nil, err
	}
	r, err := mapFD(fd, g)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	if binary.LittleEndian.Uint64(r.mem[offMagic:]) != magic ||
		binary.LittleEndian.Uint32(r.mem[offVersion:]) != version ||
		binary.LittleEndian.Uint32(r.mem[offSlotSize:]) != uint32(g.SlotSize) ||
		binary.LittleEndian.Uint32(r.mem[offSlots:]) != uint32(g.Slots) {
		r.Close()
		return nil, fmt.Errorf("%w: header does not match slot size %d, count %d", ErrGeometry, g.SlotSize, g.Slots)
	}
	return r, nil
}

// CheckSealed verifies that fd is a memfd at least minSize bytes long that can
// no longer shrink. Mapping anything else from an untrusted peer would let it
// truncate the file and crash this process with SIGBUS.
func CheckSealed(fd int, minSize int64) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("shmring: not a sealable memfd: %w", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return errors.New("shmring: memfd is not sealed against shrinking (F_SEAL_SHRINK)")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("shmring: fstat: %w", err)
	}
	if st.Size < minSize {
		return fmt.Errorf("shmring: memfd is %d bytes, need %d", st.Size, minSize)
	}
	return nil
}

func mapFD(fd int, g Geometry) (*Ring, error) {
	mem, err := unix.Mmap(fd, 0, g.Size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shmring: mmap: %w", err)
	}
	return &Ring{
		fd:     fd,
		mem:    mem,
		g:      g,
		prod:   atomicU64(mem, offProd),
		cons:   atomicU64(mem, offCons),
		wakeup: atomicU32(mem, offWakeup),
		slots:  mem[HeaderSize : HeaderSize+g.SlotSize*g.Slots : HeaderSize+g.SlotSize*g.Slots],
	}, nil
}

// FD is the ring's memfd, to pass to the peer. It stays owned by the Ring.
func (r *Ring) FD() int { return r.fd }

// CloseFD closes the ring's memfd and keeps the mapping: once the peer has
// its own copy of the fd, the owner needs only the mapping, and an fd held
// per ring would bound how many rings a process can serve.
func (r *Ring) CloseFD() error {
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// Geometry is the ring's shape.
func (r *Ring) Geometry() Geometry { return r.g }

// Close unmaps the ring and closes its fd. No Producer or Consumer of this
// Ring may be used afterwards.
func (r *Ring) Close() error {
	if r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem, r.slots = nil, nil
	if cerr := r.CloseFD(); err == nil {
		err = cerr
	}
	return err
}

// Pending is how many entries the producer published that the consumer
// has not released, read from the shared indexes: safe from any goroutine
// (neither side's own state is touched), and clamped to the ring's size,
// since the peer may publish anything.
func (r *Ring) Pending() int {
	n := r.prod.Load() - r.cons.Load()
	if n > uint64(r.g.Slots) {
		return 0
	}
	return int(n)
}

func (r *Ring) slot(i uint64) []byte {
	off := int(i&uint64(r.g.Slots-1)) * r.g.SlotSize
	return r.slots[off : off+r.g.SlotSize : off+r.g.SlotSize]
}

// Arm sets the wakeup flag for a waiter that is not the consumer itself
// (a thread waiting for any of several rings while another goroutine
// consumes): it reports whether the ring is still empty. It reads the
// shared indexes only, as a hint: the consumer side decides what is there.
func (r *Ring) Arm() bool {
	r.wakeup.Store(1)
	return r.Empty()
}

// Disarm clears the wakeup flag.
func (r *Ring) Disarm() { r.wakeup.Store(0) }

// Empty reports whether the producer has published nothing the consumer
// has not released (a hint, from the shared indexes, safe from any
// goroutine).
func (r *Ring) Empty() bool { return r.prod.Load() == r.cons.Load() }

// Producer is the side that fills slots. One goroutine at a time.
type Producer struct {
	r          *Ring
	size       uint64
	head       uint64 // next slot to reserve
	published  uint64 // index last stored to shared memory
	cachedCons uint64
	db         *Doorbell
	err        error

	// Doorbells counts the eventfd writes this producer made: the syscalls
	// that posting cost. Read it from the producing goroutine.
	Doorbells uint64
}

// Producer returns the producing side of r. db is the consumer's Doorbell,
// rung when the consumer sleeps; nil for a consumer that only polls.
func (r *Ring) Producer(db *Doorbell) *Producer {
	h := r.prod.Load()
	return &Producer{r: r, size: uint64(r.g.Slots), head: h, published: h, cachedCons: r.cons.Load(), db: db}
}

// Reserve returns the next free slot, or nil when the ring is full (or
// corrupt: see Err). The slot is the caller's to fill until Commit publishes
// it; its previous contents are stale and must be overwritten.
func (p *Producer) Reserve() []byte {
	if p.head-p.cachedCons >= p.size {
		if p.err != nil {
			return nil
		}
		c := p.r.cons.Load()
		// The consumer can never be ahead of what was published, nor more
		// than a ring behind it.
		if p.published-c > p.size {
			p.err = ErrCorrupt
			return nil
		}
		p.cachedCons = c
		if p.head-c >= p.size {
			return nil
		}
	}
	s := p.r.slot(p.head)
	p.head++
	return s
}

// Unreserve gives back the most recent uncommitted Reserve, for a caller
// that found it cannot fill the slot after all.
func (p *Producer) Unreserve() {
	if p.head > p.published {
		p.head--
	}
}

// Free reports how many slots Reserve can hand out before the ring is full,
// reloading the consumer's index.
func (p *Producer) Free() int {
	c := p.r.cons.Load()
	if p.published-c > p.size {
		p.err = ErrCorrupt
		return 0
	}
	p.cachedCons = c
	return int(p.size - (p.head - c))
}

// Pending is the number of reserved slots not yet committed.
func (p *Producer) Pending() int { return int(p.head - p.published) }

// Values of the wakeup flag: what the consumer about to sleep waits for.
const (
	WakeNone = 0
	WakeAny  = 1 // the next commit
	// WakeSolicited: the next commit its producer marks solicited
	// (CommitSolicited): a CQ armed for solicited completions only
	// (ibv_req_notify_cq with solicited_only). Any other non-zero value
	// counts as WakeAny.
	WakeSolicited = 2
)

// Commit publishes every reserved slot and rings the consumer's doorbell if
// it is asleep. It returns whether it rang (made a syscall).
func (p *Producer) Commit() (rang bool, err error) { return p.commit(true) }

// CommitSolicited is Commit for a ring whose entries may ask for a
// solicited wakeup (a CQ's: receives of messages with SE, completions in
// error): a consumer armed with WakeSolicited is rung only when solicited
// is set, one armed with WakeAny on every commit.
func (p *Producer) CommitSolicited(solicited bool) (rang bool, err error) { return p.commit(solicited) }

func (p *Producer) commit(solicited bool) (rang bool, err error) {
	if p.head == p.published {
		return false, p.err
	}
	p.published = p.head
	p.r.prod.Store(p.head)
	if p.db == nil {
		return false, p.err
	}
	// Sequentially consistent store then load: either the consumer sees our
	// index when it rechecks after arming, or we see its flag here. The
	// flag is cleared by the producer that rings (one wakeup per arming);
	// the consumer may change it meanwhile, hence the compare-and-swap,
	// tried a bounded number of times against a peer that keeps changing
	// it.
	for range 4 {
		w := p.r.wakeup.Load()
		if w == WakeNone || w == WakeSolicited && !solicited {
			return false, p.err
		}
		if p.r.wakeup.CompareAndSwap(w, WakeNone) {
			p.Doorbells++
			return true, p.db.Ring()
		}
	}
	return false, p.err
}

// Err returns ErrCorrupt once the consumer has been seen publishing an
// impossible index.
func (p *Producer) Err() error { return p.err }

// Consumer is the side that drains slots. One goroutine at a time.
type Consumer struct {
	r          *Ring
	size       uint64
	tail       uint64 // next slot to read
	released   uint64 // index last stored to shared memory
	cachedProd uint64
	err        error
}

// Consumer returns the consuming side of r.
func (r *Ring) Consumer() *Consumer {
	t := r.cons.Load()
	return &Consumer{r: r, size: uint64(r.g.Slots), tail: t, released: t, cachedProd: t}
}

// Peek returns the next filled slot and advances past it, or returns nil when
// the ring is empty (or corrupt: see Err). The slot stays valid, and is not
// reused by the producer, until Release.
func (c *Consumer) Peek() []byte {
	if c.tail == c.cachedProd {
		if !c.reload() {
			return nil
		}
	}
	s := c.r.slot(c.tail)
	c.tail++
	return s
}

// Unpeek steps back over the most recent Peek not yet released, for a
// consumer that could not act on the slot now and will take it again later.
func (c *Consumer) Unpeek() { c.Rewind(1) }

// Rewind steps back over the n most recent Peeks not yet released (fewer
// if fewer were made).
func (c *Consumer) Rewind(n int) {
	c.tail -= min(uint64(n), c.tail-c.released)
}

// reload refreshes the cached producer index and reports whether there is
// something to read.
func (c *Consumer) reload() bool {
	if c.err != nil {
		return false
	}
	p := c.r.prod.Load()
	if p-c.released > c.size || p-c.cachedProd > c.size {
		c.err = ErrCorrupt
		return false
	}
	c.cachedProd = p
	return c.tail != p
}

// Len reports how many filled slots are ready to Peek, reloading the
// producer's index.
func (c *Consumer) Len() int {
	c.reload()
	return int(c.cachedProd - c.tail)
}

// Release hands every slot returned by Peek back to the producer.
func (c *Consumer) Release() {
	if c.tail != c.released {
		c.released = c.tail
		c.r.cons.Store(c.tail)
	}
}

// Arm tells the producer that this consumer is about to sleep, then rechecks
// the ring. It returns true if the ring is still empty and the caller may
// block on its Doorbell; false if entries arrived (the caller should consume
// them; the flag stays set and is cleared by Disarm or by the producer).
func (c *Consumer) Arm() bool { return c.ArmFor(WakeAny) }

// ArmFor is Arm waiting for what wake says (WakeAny, WakeSolicited).
func (c *Consumer) ArmFor(wake uint32) bool {
	c.r.wakeup.Store(wake)
	return !c.reload()
}

// Disarm clears the wakeup flag after a sleep, so that producers stop ringing
// while the consumer is busy.
func (c *Consumer) Disarm() { c.r.wakeup.Store(0) }

// Err returns ErrCorrupt once the producer has been seen publishing an
// impossible index.
func (c *Consumer) Err() error { return c.err }
