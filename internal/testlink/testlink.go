package testlink

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
)

// Addresses and MACs of the devices Loopback and Pair make.
var (
	MACA, MACB   = [6]byte{2, 0, 0, 0, 0, 0xa}, [6]byte{2, 0, 0, 0, 0, 0xb}
	AddrA, AddrB = netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")
)

// Resolver is a neighbour table for Config.Resolve.
func Resolver(macs map[netip.Addr][6]byte) func(context.Context, netip.Addr) ([6]byte, error) {
	return func(_ context.Context, a netip.Addr) ([6]byte, error) {
		m, ok := macs[a.Unmap()]
		if !ok {
			return m, fmt.Errorf("no neighbour %v", a)
		}
		return m, nil
	}
}

// Loopback returns device A (MACA, AddrA, name "loop0") on a link to
// itself, its engine running until the test ends: its QPs reach each
// other as on one host. mtu is the port MTU (0: 1024).
func Loopback(t testing.TB, mtu int) *rnic.Device {
	t.Helper()
	return LoopbackWith(t, mtu, engine.Options{})
}

// LoopbackWith is Loopback with the engine's options.
func LoopbackWith(t testing.TB, mtu int, opt engine.Options) *rnic.Device {
	t.Helper()
	if mtu == 0 {
		mtu = 1024
	}
	dev, err := rnic.NewDevice(rnic.Config{Name: "loop0", MAC: MACA, Addrs: []netip.Addr{AddrA}, PortMTU: mtu,
		Resolve: Resolver(map[netip.Addr][6]byte{AddrA: MACA})})
	if err != nil {
		t.Fatal(err)
	}
	p := memlink.NewLoop(memlink.Config{MaxFrame: mtu + 200})
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	Run(t, dev, p, opt)
	return dev
}

// Pair returns devices A and B ("mem-a", "mem-b") joined by a memlink
// pair, their engines running until the test ends; each resolves both
// addresses.
func Pair(t testing.TB, mtu int) (a, b *rnic.Device) {
	t.Helper()
	a, b, pa, pb := Devices(t, mtu)
	Run(t, a, pa, engine.Options{})
	Run(t, b, pb, engine.Options{})
	return a, b
}

// Devices is Pair without the engines: the caller runs them (Run, or its
// own engine.Loop), with its options or around a wrapped port.
func Devices(t testing.TB, mtu int) (a, b *rnic.Device, pa, pb *memlink.Port) {
	t.Helper()
	if mtu == 0 {
		mtu = 1024
	}
	pa, pb = memlink.NewPair(memlink.Config{MaxFrame: mtu + 200})
	t.Cleanup(func() {
		if err := errors.Join(pa.Close(), pb.Close()); err != nil {
			t.Error(err)
		}
	})
	res := Resolver(map[netip.Addr][6]byte{AddrA: MACA, AddrB: MACB})
	a, err := rnic.NewDevice(rnic.Config{Name: "mem-a", MAC: MACA, Addrs: []netip.Addr{AddrA}, PortMTU: mtu, Resolve: res})
	if err != nil {
		t.Fatal(err)
	}
	b, err = rnic.NewDevice(rnic.Config{Name: "mem-b", MAC: MACB, Addrs: []netip.Addr{AddrB}, PortMTU: mtu, Resolve: res})
	if err != nil {
		t.Fatal(err)
	}
	return a, b, pa, pb
}

// Run drives dev on p with an engine until the test ends.
func Run(t testing.TB, dev *rnic.Device, p port.Port, opt engine.Options) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- engine.Run(ctx, dev, p, opt) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("engine of %s: %v", dev.Name(), err)
		}
	})
}
