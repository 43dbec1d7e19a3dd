package main

import (
	"os"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/afpacket"
)

// TestReportsStackDelivery sends RoCEv2 frames over a veth pair whose
// receiving end has no XDP program: each must be reported once, with the
// receiving veth's ifindex and namespace and xdp=0; with an XDP program on
// the sending end only, the report must say peer_xdp=1. Frames in a
// namespace that is not watched are not reported.
func TestReportsStackDelivery(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	tr, err := newTracer([]string{pair.B.NS.Name})
	if err != nil {
		t.Fatalf("vethtrace: %v", err)
	}
	t.Cleanup(func() { tr.Close() })

	var tx *afpacket.Port
	if err := pair.A.NS.Do(func() (err error) {
		tx, err = afpacket.Open(afpacket.Config{IfIndex: pair.A.Index})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Close() })
	send := func(seq uint32) {
		t.Helper()
		f := netnstest.RoCEFrame(make([]byte, 64), &pair.A, &pair.B, seq)
		if n, err := port.Send(tx, [][]byte{f}); n != 1 || err != nil {
			t.Fatalf("send: %d, %v", n, err)
		}
	}
	expect := func(seq uint32, peerXDP uint32) {
		t.Helper()
		got := make(chan event, 1)
		go func() {
			e, _, err := tr.next()
			if err == nil {
				got <- e
			}
		}()
		select {
		case e := <-got:
			if e.Ifindex != uint32(pair.B.Index) || e.XDP != 0 || e.PeerXDP != peerXDP || e.Sport != uint16(49152+seq%1024) {
				t.Fatalf("event %+v, want ifindex %d, xdp 0, peer_xdp %d, sport %d", e, pair.B.Index, peerXDP, 49152+seq%1024)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no event for frame %d", seq)
		}
	}
	// A frame into A's namespace, which is not watched, comes first: the
	// first event must still be frame 1's.
	var txB *afpacket.Port
	if err := pair.B.NS.Do(func() (err error) {
		txB, err = afpacket.Open(afpacket.Config{IfIndex: pair.B.Index})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { txB.Close() })
	back := netnstest.RoCEFrame(make([]byte, 64), &pair.B, &pair.A, 7)
	if n, err := port.Send(txB, [][]byte{back}); n != 1 || err != nil {
		t.Fatalf("send into A: %d, %v", n, err)
	}
	send(1)
	expect(1, 0)

	var prog *bpf.Program
	if err := pair.A.NS.Do(func() (err error) {
		if prog, err = bpf.Load(bpf.Options{Queues: 1}); err != nil {
			return err
		}
		_, err = prog.Attach(pair.A.Index)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	send(2)
	expect(2, 1)
}

// TestTracerSetupFails: a namespace that does not exist fails newTracer
// with an error, the BPF objects loaded so far released, and no panic.
func TestTracerSetupFails(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads a BPF program")
	}
	if tr, err := newTracer([]string{"/nonexistent/netns"}); err == nil {
		_ = tr.Close()
		t.Fatal("newTracer watched a namespace that does not exist")
	}
}
