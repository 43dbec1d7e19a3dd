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

// TestRpingThroughDaemonOverVeth: `softrnic rping -V --daemon SOCKET`,
// whose connection the daemon's CM agent makes (on its GSI QP, namespace
// A's veth end, AF_XDP) and whose QP lives in the daemon, against an
// in-process `softrnic rping` on its own AF_XDP port in namespace B; the
// daemon's side as server and as client, ten verified pings at 64 and
// 3000 bytes (multi-packet READ and WRITE), every line as the stock tool
// prints it.
func TestRpingThroughDaemonOverVeth(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	bin := buildSoftrnic(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sock, _ := startDaemon(t, bin, pair.A)
	for _, tc := range []struct {
		name         string
		size         int
		daemonServes bool
	}{{"64/daemon-server", 64, true}, {"64/daemon-client", 64, false}, {"3000/daemon-server", 3000, true}, {"3000/daemon-client", 3000, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			common := []string{"-V", "-v", "-C", "10", "-S", strconv.Itoa(tc.size)}
			var sargs, cargs rpingArgs
			var err error
			if tc.daemonServes {
				sargs, err = parseRping(append([]string{"-s", "--daemon", sock}, common...))
				if err == nil {
					cargs, err = parseRping(append([]string{"-c", "-a", pair.A.Addr.String(), "-d", pair.B.Name}, common...))
				}
			} else {
				sargs, err = parseRping(append([]string{"-s", "-d", pair.B.Name}, common...))
				if err == nil {
					cargs, err = parseRping(append([]string{"-c", "-a", pair.B.Addr.String(), "--daemon", sock}, common...))
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			sargs.kind, cargs.kind = "afxdp", "afxdp"
			// The in-process side runs in namespace B; the daemon's side
			// needs no namespace (the socket is a file, the daemon in A).
			in := func(daemonSide bool, f func() error) error {
				if daemonSide {
					return f()
				}
				return pair.B.NS.Do(f)
			}
			var sout, cout bytes.Buffer
			ready := make(chan struct{})
			serr := make(chan error, 1)
			go func() {
				serr <- in(tc.daemonServes, func() error { return rpingMain(ctx, sargs, &sout, func() { close(ready) }) })
			}()
			select {
			case <-ready:
			case err := <-serr:
				t.Fatalf("server: %v", err)
			}
			cerr := in(!tc.daemonServes, func() error { return rpingMain(ctx, cargs, &cout, nil) })
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
			want := make([]byte, tc.size)
			for i, l := range lines {
				cmrping.FillPing(want, i)
				if l != "ping data: "+string(want[:tc.size-1]) {
					t.Fatalf("ping %d: %q", i, l)
				}
			}
		})
	}
}
