package rnic

import "sync/atomic"

// table maps 32-bit keys (an MR's lkey and rkey, a QP's number) to
// objects, for the data path to find what a packet or a work request
// names. A lookup takes no lock: one atomic load of the slot array, then
// atomic loads of the slots it probes (open addressing, linear probing). An
// insert or a removal runs under the device's control lock and writes one
// slot in place; the slot array is rebuilt, twice as large or the same
// size without its tombstones, only when entries and tombstones fill half
// of it, so an insert costs O(1) amortised where a copy-on-write map cost
// O(n) per insert. A reader that loaded the array before a rebuild keeps a
// consistent older view, as it would a copy-on-write snapshot; callers
// check what they find (an MR's valid flag, a QP's destroyed one).
type table[T any] struct {
	slots atomic.Pointer[[]atomic.Pointer[entry[T]]]
	tomb  *entry[T] // marks a removed entry: probes go on past it
	live  int       // entries (guarded by the owner's lock)
	used  int       // entries and tombstones (guarded by the owner's lock)
}

type entry[T any] struct {
	key uint32
	v   *T
}

const minTableSlots = 64

func newTable[T any]() *table[T] {
	t := &table[T]{tomb: new(entry[T])}
	s := make([]atomic.Pointer[entry[T]], minTableSlots)
	t.slots.Store(&s)
	return t
}

// home is key's first slot in an array of n slots (n a power of two):
// Fibonacci hashing spreads sequential keys (QPNs) and random ones alike.
func home(key uint32, n int) int { return int((key * 0x9E3779B1) & uint32(n-1)) }

// get returns the object of key, nil if none. Safe from any goroutine.
func (t *table[T]) get(key uint32) *T {
	s := *t.slots.Load()
	mask := len(s) - 1
	for i := home(key, len(s)); ; i = (i + 1) & mask {
		e := s[i].Load()
		if e == nil {
			return nil
		}
		if e != t.tomb && e.key == key {
			return e.v
		}
	}
}

// put adds key → v; key must not be in the table. Caller holds the lock.
func (t *table[T]) put(key uint32, v *T) {
	s := *t.slots.Load()
	if 2*(t.used+1) > len(s) {
		n := len(s)
		if 4*(t.live+1) > n {
			n *= 2
		}
		s = t.rebuild(n)
	}
	mask := len(s) - 1
	for i := home(key, len(s)); ; i = (i + 1) & mask {
		e := s[i].Load()
		if e == nil || e == t.tomb {
			if e == nil {
				t.used++
			}
			t.live++
			s[i].Store(&entry[T]{key: key, v: v})
			return
		}
	}
}

// remove drops key's entry, if any. Caller holds the lock.
func (t *table[T]) remove(key uint32) {
	s := *t.slots.Load()
	mask := len(s) - 1
	for i := home(key, len(s)); ; i = (i + 1) & mask {
		e := s[i].Load()
		if e == nil {
			return
		}
		if e != t.tomb && e.key == key {
			s[i].Store(t.tomb)
			t.live--
			return
		}
	}
}

// rebuild publishes a fresh array of n slots holding the live entries.
func (t *table[T]) rebuild(n int) []atomic.Pointer[entry[T]] {
	old := *t.slots.Load()
	s := make([]atomic.Pointer[entry[T]], n)
	for i := range old {
		e := old[i].Load()
		if e == nil || e == t.tomb {
			continue
		}
		for j := home(e.key, n); ; j = (j + 1) & (n - 1) {
			if s[j].Load() == nil {
				s[j].Store(e)
				break
			}
		}
	}
	t.used = t.live
	t.slots.Store(&s)
	return s
}

// each calls fn with every object, in no particular order. Safe from any
// goroutine (it sees the table as of its array load).
func (t *table[T]) each(fn func(*T)) {
	s := *t.slots.Load()
	for i := range s {
		if e := s[i].Load(); e != nil && e != t.tomb {
			fn(e.v)
		}
	}
}
