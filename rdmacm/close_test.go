package rdmacm

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// countingDevice is an rnic.Device that counts the verbs objects made
// through it and not yet released, by kind. Its wrappers hand the device's
// own objects back to it where a verb takes one (a CQ in QPInitAttr, memory
// in RegMR, an AH in a send WR).
type countingDevice struct {
	*rnic.Device
	mu   sync.Mutex
	live map[string]int
}

func (d *countingDevice) add(kind string, n int) {
	d.mu.Lock()
	d.live[kind] += n
	d.mu.Unlock()
}

// leaks lists the kinds with objects still alive.
func (d *countingDevice) leaks() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := maps.Clone(d.live)
	maps.DeleteFunc(m, func(_ string, n int) bool { return n == 0 })
	return m
}

func (d *countingDevice) AllocMem(n int) (verbs.Mem, error) {
	m, err := d.Device.AllocMem(n)
	if err != nil {
		return nil, err
	}
	d.add("Mem", 1)
	return &countingMem{m, d}, nil
}

func (d *countingDevice) AllocPD() (verbs.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	d.add("PD", 1)
	return &countingPD{pd, d}, nil
}

func (d *countingDevice) CreateCQ(depth int) (verbs.CQ, error) {
	cq, err := d.Device.CreateCQ(depth)
	if err != nil {
		return nil, err
	}
	d.add("CQ", 1)
	return &countingCQ{cq.(*rnic.CQ), d}, nil
}

type countingMem struct {
	verbs.Mem
	d *countingDevice
}

func (m *countingMem) Free() error { m.d.add("Mem", -1); return m.Mem.Free() }

// countingCQ embeds the device's CQ, so that it notifies as the agent needs.
type countingCQ struct {
	*rnic.CQ
	d *countingDevice
}

func (c *countingCQ) Destroy() error { c.d.add("CQ", -1); return c.CQ.Destroy() }

type countingPD struct {
	verbs.PD
	d *countingDevice
}

func (p *countingPD) Dealloc() error { p.d.add("PD", -1); return p.PD.Dealloc() }

func (p *countingPD) RegMR(m verbs.Mem, off, n int, iova uint64, access ib.Access) (verbs.MR, error) {
	mr, err := p.PD.RegMR(m.(*countingMem).Mem, off, n, iova, access)
	if err != nil {
		return nil, err
	}
	p.d.add("MR", 1)
	return &countingMR{mr, p.d}, nil
}

func (p *countingPD) CreateQP(a *verbs.QPInitAttr) (verbs.QP, error) {
	at := *a
	at.SendCQ, at.RecvCQ = a.SendCQ.(*countingCQ).CQ, a.RecvCQ.(*countingCQ).CQ
	q, err := p.PD.CreateQP(&at)
	if err != nil {
		return nil, err
	}
	p.d.add("QP", 1)
	return &countingQP{q, p.d}, nil
}

func (p *countingPD) CreateAH(av *ib.AddressVector) (verbs.AH, error) {
	ah, err := p.PD.CreateAH(av)
	if err != nil {
		return nil, err
	}
	p.d.add("AH", 1)
	return &countingAH{ah, p.d}, nil
}

type countingMR struct {
	verbs.MR
	d *countingDevice
}

func (m *countingMR) Dereg() error { m.d.add("MR", -1); return m.MR.Dereg() }

type countingAH struct {
	verbs.AH
	d *countingDevice
}

func (a *countingAH) Destroy() error { a.d.add("AH", -1); return a.AH.Destroy() }

type countingQP struct {
	verbs.QP
	d *countingDevice
}

func (q *countingQP) Destroy() error { q.d.add("QP", -1); return q.QP.Destroy() }

func (q *countingQP) PostSend(wrs []verbs.SendWR) (int, error) {
	wrs = slices.Clone(wrs)
	for i := range wrs {
		if ah, ok := wrs[i].AH.(*countingAH); ok {
			wrs[i].AH = ah.AH
		}
	}
	return q.QP.PostSend(wrs)
}

// appQP is an application's QP made on the device under a countingDevice:
// to the agent, a QP of its device.
type appQP struct {
	*rnic.QP
	dev verbs.Device
}

func (q *appQP) Device() verbs.Device { return q.dev }

// TestCloseReleasesEverything: an agent that has connected (and so made an
// address handle for its peer) leaves nothing on its device once closed:
// no QP, MR, memory, AH, CQ or PD.
func TestCloseReleasesEverything(t *testing.T) {
	la, lb := memlink.NewPair(memlink.Config{Seed: 7})
	resolve := func(_ context.Context, peer netip.Addr) ([6]byte, error) {
		switch peer {
		case ipA:
			return macA, nil
		case ipB:
			return macB, nil
		}
		return [6]byte{}, errors.New("no neighbour")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	mkDev := func(mac [6]byte, ip netip.Addr, p *memlink.Port) *rnic.Device {
		dev, err := rnic.NewDevice(rnic.Config{MAC: mac, Addrs: []netip.Addr{ip}})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = runEngine(ctx, dev, p) }()
		return dev
	}
	devA, devB := mkDev(macA, ipA, la), mkDev(macB, ipB, lb)
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = la.Close()
		_ = lb.Close()
	})
	counted := &countingDevice{Device: devA, live: map[string]int{}}
	agentA, err := New(Config{Device: counted, Resolve: resolve, CM: testCM})
	if err != nil {
		t.Fatal(err)
	}
	agentB, err := New(Config{Device: devB, Resolve: resolve, CM: testCM})
	if err != nil {
		t.Fatal(err)
	}
	defer agentB.Close()
	pdA, cqA := newHostObjects(devA)
	pdB, cqB := newHostObjects(devB)
	a := &host{dev: devA, agent: agentA, ip: ipA, pd: pdA, cq: cqA}
	b := &host{dev: devB, agent: agentB, ip: ipB, pd: pdB, cq: cqB}

	ln, err := b.agent.Listen(7174, 0)
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	pb, _ := b.params(t, 1)
	accepted := make(chan error, 1)
	go func() {
		c, err := accept(cctx, ln, pb)
		if err == nil {
			err = c.Close()
		}
		accepted <- err
	}()
	pa, _ := a.params(t, 1)
	q, err := pa.newQP()
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.agent.Connect(cctx, &appQP{q.(*rnic.QP), counted}, ipB, 7174, &pa.ConnParam)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil && !errors.Is(err, ErrDisconnected) {
		t.Fatal(err)
	}
	if n := counted.leaks()["AH"]; n == 0 {
		t.Fatal("the agent made no address handle: the test shows nothing")
	}
	if err := agentA.Close(); err != nil {
		t.Fatal(err)
	}
	if l := counted.leaks(); len(l) != 0 {
		t.Fatalf("objects left on the device after Close: %v", l)
	}
}
