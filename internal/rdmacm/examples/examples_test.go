package examples

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
)

// runEngine drives a device on a port until ctx ends. The engine loop may
// move from daemon to engine: this is the one place to change.
func runEngine(ctx context.Context, dev *rnic.Device, p port.Port) error {
	return engine.Run(ctx, dev, p, engine.Options{})
}

var (
	ipS, ipC   = netip.MustParseAddr("10.71.0.1"), netip.MustParseAddr("10.71.0.2")
	macS, macC = [6]byte{2, 0, 0, 0, 0x71, 1}, [6]byte{2, 0, 0, 0, 0x71, 2}
)

func setup(t *testing.T) (srv, cli *rdmacm.Agent) {
	la, lb := memlink.NewPair(memlink.Config{Seed: 5})
	macs := map[netip.Addr][6]byte{ipS: macS, ipC: macC}
	resolve := func(_ context.Context, peer netip.Addr) ([6]byte, error) {
		if m, ok := macs[peer]; ok {
			return m, nil
		}
		return [6]byte{}, errors.New("no neighbour")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	mk := func(mac [6]byte, ip netip.Addr, p port.Port) *rdmacm.Agent {
		dev, err := rnic.NewDevice(rnic.Config{MAC: mac, Addrs: []netip.Addr{ip}})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := runEngine(ctx, dev, p); err != nil && !errors.Is(err, context.Canceled) {
				t.Error(err)
			}
		}()
		a, err := rdmacm.New(rdmacm.Config{Device: dev, Resolve: resolve})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	srv, cli = mk(macS, ipS, la), mk(macC, ipC, lb)
	t.Cleanup(func() {
		srv.Close()
		cli.Close()
		cancel()
		wg.Wait()
	})
	return srv, cli
}

// TestServerClient: one exchange, both sides disconnecting at once (their
// DREQs cross, as with the stock tools), both ending with status 0.
func TestServerClient(t *testing.T) {
	srv, cli := setup(t)
	for round := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		var sout, cout bytes.Buffer
		ready := make(chan struct{})
		serr := make(chan error, 1)
		go func() { serr <- Server(ctx, srv.Device(), srv, DefaultPort, &sout, func() { close(ready) }) }()
		<-ready
		cerr := Client(ctx, cli.Device(), cli, ipS, DefaultPort, &cout)
		if err := <-serr; err != nil || cerr != nil {
			t.Fatalf("round %d: server %v, client %v", round, err, cerr)
		}
		cancel()
		if sout.String() != "rdma_server: start\nrdma_server: end 0\n" || cout.String() != "rdma_client: start\nrdma_client: end 0\n" {
			t.Fatalf("output %q %q", sout.String(), cout.String())
		}
	}
}

// TestClientNoServer: nobody listens: the client reports the REJ and ends
// with -1.
func TestClientNoServer(t *testing.T) {
	_, cli := setup(t)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := Client(ctx, cli.Device(), cli, ipS, DefaultPort, &out)
	var rej *rdmacm.RejectedError
	if !errors.As(err, &rej) || rej.Reason != 8 || out.String() != "rdma_client: start\nrdma_client: end -1\n" {
		t.Fatalf("%v %q", err, out.String())
	}
}
