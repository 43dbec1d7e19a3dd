package pingpong

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/netnstest"
)

// TestPingpongOverVethAFXDP runs `softrnic pingpong` (RunCLI, what the
// command calls) rc and ud with --chk between two network namespaces
// joined by a veth pair, each end on its own AF_XDP port, with path MTU
// 1024 and 4096 and IPv4 and IPv6 GIDs (-g), the side channel over TCP
// between the namespaces' addresses.
func TestPingpongOverVethAFXDP(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{MTU: 4200})
	gidIndex := func(l netnstest.Link, v6 bool) int {
		idx := -1
		if err := l.NS.Do(func() error {
			in, err := host.LookupInterface(l.Name)
			if err != nil {
				return err
			}
			want := l.Addr
			if v6 {
				want = l.Addr6
			}
			for i, g := range in.GIDs {
				if g == want {
					idx = i
				}
			}
			return nil
		}); err != nil || idx < 0 {
			t.Fatalf("GID index of %s (v6 %v): %d %v", l.Name, v6, idx, err)
		}
		return idx
	}
	for _, tr := range []Transport{RC, UD} {
		for _, mtu := range []int{1024, 4096} {
			for _, v6 := range []bool{false, true} {
				name := fmt.Sprintf("%v/mtu%d/v%d", tr, mtu, map[bool]int{false: 4, true: 6}[v6])
				t.Run(name, func(t *testing.T) {
					args := []string{"-m", fmt.Sprint(mtu), "-s", "4096", "-n", "100", "--chk"}
					if tr == UD {
						args = []string{"-s", fmt.Sprint(mtu), "-n", "100", "--chk"}
					}
					ps, err := ParseArgs(tr, append([]string{"-d", pair.A.Name, "-g", fmt.Sprint(gidIndex(pair.A, v6))}, args...))
					if err != nil {
						t.Fatal(err)
					}
					pc, err := ParseArgs(tr, append([]string{"-d", pair.B.Name, "-g", fmt.Sprint(gidIndex(pair.B, v6)), pair.A.Addr.String()}, args...))
					if err != nil {
						t.Fatal(err)
					}
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					var sout, cout bytes.Buffer
					var sres, cres Result
					listening := make(chan struct{})
					serr := make(chan error, 1)
					go func() {
						serr <- pair.A.NS.Do(func() (err error) {
							sres, err = RunCLI(ctx, ps, CLIOptions{PortKind: host.AFXDP, Listening: func(net.Addr) { close(listening) }}, &sout)
							return err
						})
					}()
					select {
					case <-listening:
					case err := <-serr:
						t.Fatalf("server: %v", err)
					}
					cerr := pair.B.NS.Do(func() (err error) {
						cres, err = RunCLI(ctx, pc, CLIOptions{PortKind: host.AFXDP, DialFor: 5 * time.Second}, &cout)
						return err
					})
					if cerr != nil {
						cancel()
					}
					if err := <-serr; err != nil || cerr != nil {
						t.Fatalf("server: %v\nclient: %v\nserver output: %s\nclient output: %s", err, cerr, sout.String(), cout.String())
					}
					if sres.Checked != 100 || cres.Checked != 100 {
						t.Fatalf("checked: server %d client %d", sres.Checked, cres.Checked)
					}
					wantAddr := pair.A.Addr
					if v6 {
						wantAddr = pair.A.Addr6
					}
					if cres.Remote.Addr() != wantAddr {
						t.Fatalf("client's peer GID %v, want %v", cres.Remote.Addr(), wantAddr)
					}
					if !strings.Contains(cout.String(), "100 iters in") {
						t.Fatalf("client output: %s", cout.String())
					}
					t.Logf("client: %s", strings.TrimSpace(cout.String()[strings.Index(cout.String(), "bytes in")-7:]))
				})
			}
		}
	}
}
