package rnic

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"

	"github.com/softrnic/softrnic/ib"
)

// TestTable: puts, gets and removes against a map, through growth and
// tombstone rebuilds, with a reader running concurrently (-race).
func TestTable(t *testing.T) {
	tb := newTable[int]()
	ref := map[uint32]*int{}
	rng := rand.New(rand.NewPCG(1, 2))
	var mu sync.Mutex
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // a lock-free reader, as the data path
		defer close(done)
		rng := rand.New(rand.NewPCG(3, 4))
		for {
			select {
			case <-stop:
				return
			default:
			}
			tb.get(rng.Uint32())
			tb.each(func(*int) {})
		}
	}()
	var keys []uint32
	for i := 0; i < 20000; i++ {
		mu.Lock()
		if len(keys) > 0 && rng.IntN(3) == 0 {
			j := rng.IntN(len(keys))
			k := keys[j]
			keys[j] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			tb.remove(k)
			delete(ref, k)
		} else {
			k := uint32(i)*2654435761 + 7 // distinct
			v := i
			tb.put(k, &v)
			ref[k] = &v
			keys = append(keys, k)
		}
		mu.Unlock()
	}
	close(stop)
	<-done
	for k, v := range ref {
		if tb.get(k) != v {
			t.Fatalf("key %#x lost", k)
		}
	}
	n := 0
	tb.each(func(*int) { n++ })
	if n != len(ref) || tb.live != len(ref) {
		t.Fatalf("each saw %d, live %d, want %d", n, tb.live, len(ref))
	}
	if s := len(*tb.slots.Load()); s > 8*len(ref) || 2*tb.used > s {
		t.Fatalf("%d slots for %d entries (%d used)", s, len(ref), tb.used)
	}
	if tb.get(0xdeadbeef) != nil {
		t.Fatal("found a key never put")
	}
}

// BenchmarkRegMR registers and deregisters MRs on a device that already
// holds n: the cost per registration must not grow with n (it did, the
// whole key map being copied each time).
func BenchmarkRegMR(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			d, _ := NewDevice(Config{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
			pd := d.allocPD()
			buf := make([]byte, 64)
			for i := 0; i < n; i++ {
				if _, err := pd.RegBytes(buf, 0, ib.LocalWrite); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				m, err := pd.RegBytes(buf, 0, ib.LocalWrite)
				if err != nil {
					b.Fatal(err)
				}
				m.Dereg()
			}
		})
	}
}
