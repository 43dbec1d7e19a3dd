package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	cmrping "github.com/softrnic/softrnic/internal/cm/rping"
	"github.com/softrnic/softrnic/internal/netnstest"
)

func TestParseRping(t *testing.T) {
	r, err := parseRping([]string{"-c", "-a", "10.0.0.1", "-C", "10", "-S", "128", "-v", "-V", "-p", "9999", "-d", "eth1"})
	if err != nil || !r.client || r.server || r.addr.String() != "10.0.0.1" || r.opts.Count != 10 || r.opts.Size != 128 ||
		!r.opts.Verbose || !r.opts.Validate || r.opts.Port != 9999 || r.iface != "eth1" {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = parseRping([]string{"-s"})
	if err != nil || !r.server || r.opts.Port != 7174 || r.opts.Size != 64 || r.opts.Count != 0 {
		t.Fatalf("defaults: %+v %v", r, err)
	}
	for _, bad := range [][]string{{}, {"-s", "-c"}, {"-c"}, {"-c", "-a", "10.0.0.1", "-p", "70000"}, {"-s", "extra"}, {"-c", "-a", "10.0.0.1", "-C", "-1"}, {"-s", "-S", "25"}, {"-s", "-S", "65536"}} {
		if _, err := parseRping(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestRpingOverVethAFXDP: softrnic rping server in one namespace, client in
// another, over a veth pair, each on its own AF_XDP port: ten verified
// pings of 64 bytes, then of 3000 bytes (multi-packet READ and WRITE at
// path MTU 1024), and 64 bytes between IPv6 GIDs, every line as the
// stock tool prints it.
func TestRpingOverVethAFXDP(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	for _, tc := range []struct {
		name string
		size int
		v6   bool
	}{{"64", 64, false}, {"3000", 3000, false}, {"ipv6-64", 64, true}} {
		size := tc.size
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			common := []string{"-V", "-v", "-C", "10", "-S", strconv.Itoa(size)}
			sargs, err := parseRping(append([]string{"-s", "-d", pair.A.Name}, common...))
			if err != nil {
				t.Fatal(err)
			}
			server := pair.A.Addr
			if tc.v6 {
				server = pair.A.Addr6
			}
			cargs, err := parseRping(append([]string{"-c", "-a", server.String()}, common...))
			if err != nil {
				t.Fatal(err)
			}
			sargs.kind, cargs.kind = "afxdp", "afxdp"
			var sout, cout bytes.Buffer
			ready := make(chan struct{})
			serr := make(chan error, 1)
			go func() {
				serr <- pair.A.NS.Do(func() error { return rpingMain(ctx, sargs, &sout, func() { close(ready) }) })
			}()
			select {
			case <-ready:
			case err := <-serr:
				t.Fatalf("server: %v", err)
			}
			cerr := pair.B.NS.Do(func() error { return rpingMain(ctx, cargs, &cout, nil) })
			if cerr != nil {
				cancel()
			}
			if err := <-serr; err != nil || cerr != nil {
				t.Fatalf("server: %v\nclient: %v\nserver output:\n%s\nclient output:\n%s", err, cerr, sout.String(), cout.String())
			}
			lines := strings.Split(strings.TrimSpace(cout.String()), "\n")
			if len(lines) != 10 || strings.Count(sout.String(), "server ping data: ") != 10 {
				t.Fatalf("client output:\n%s\nserver output:\n%s", cout.String(), sout.String())
			}
			want := make([]byte, size)
			for i, l := range lines {
				cmrping.FillPing(want, i)
				if l != "ping data: "+string(want[:size-1]) {
					t.Fatalf("ping %d: %q", i, l)
				}
			}
		})
	}
}
