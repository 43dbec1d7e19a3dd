package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/internal/perftest"
)

// BenchmarkSend64DaemonOverhead is the daemon's overhead figure: 64-byte SEND
// latency (send_lat, half round trip) and message rate (send_bw, the
// sender's) of `softrnic perf` with its QPs in a daemon (--daemon) and with
// its own device in process, both over a real AF_XDP port on namespace A's
// veth end, against an in-process `softrnic perf` on its own AF_XDP port in
// namespace B. Only one process can own A's AF_XDP queue, so each round
// runs the in-process side, then starts the daemon, runs the daemon side
// and stops it, alternating which goes first: A/B interleaved, so machine
// load drifts hit both alike. It prints every round and the medians. The
// local ACK timeout is -u 18 (1.07 s): on a loaded 2-core host a 67 ms
// timeout (perftest's default) can run out of retries.
//
//	go test ./cmd/softrnic -run '^$' -bench Send64DaemonOverhead -benchtime 1x
func BenchmarkSend64DaemonOverhead(b *testing.B) {
	netnstest.SkipUnlessRoot(b)
	bin := filepath.Join(b.TempDir(), "softrnic")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	pair := netnstest.NewTestPair(b, netnstest.PairOptions{})
	const rounds, latIters, bwIters = 5, 10000, 100000
	type figures struct{ p50, p99, mpps []float64 }
	res := map[string]*figures{"inprocess": {}, "daemon": {}}
	b.ResetTimer()
	for range b.N {
		for r := 0; r < rounds; r++ {
			modes := []string{"inprocess", "daemon"}
			if r%2 == 1 {
				modes = []string{"daemon", "inprocess"}
			}
			for _, mode := range modes {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				side := []string{"-d", pair.A.Name}
				stop := func() {}
				if mode == "daemon" {
					var sock string
					sock, stop = startDaemon(b, bin, pair.A)
					side = []string{"--daemon", sock}
				}
				run := func(test string, args ...string) perftest.JSONResult {
					common := append([]string{"perf", test, "--json", "-s", "64", "-u", "18"}, args...)
					srv := append([]string{"netns", "exec", pair.B.NS.Name, bin}, append(common, "-d", pair.B.Name)...)
					cli := append([]string{"netns", "exec", pair.A.NS.Name, bin}, append(append(common, side...), pair.B.Addr.String())...)
					_, cout := runPerfPair(b, ctx, srv, cli)
					var j perftest.JSONResult
					if err := json.Unmarshal(cout, &j); err != nil {
						b.Fatalf("%s %s JSON: %v\n%s", mode, test, err, cout)
					}
					return j
				}
				lat := run("send_lat", "-n", fmt.Sprint(latIters))
				bw := run("send_bw", "-n", fmt.Sprint(bwIters))
				stop()
				cancel()
				if len(lat.Lat) != 1 || len(bw.BW) != 1 {
					b.Fatalf("%s: results %+v %+v", mode, lat, bw)
				}
				f := res[mode]
				f.p50 = append(f.p50, lat.Lat[0].Typical)
				f.p99 = append(f.p99, lat.Lat[0].P99)
				f.mpps = append(f.mpps, bw.BW[0].MsgRate)
				b.Logf("round %d %-9s send_lat 64 B p50 %6.2f µs p99 %7.2f µs   send_bw 64 B %.4f Mpps", r, mode, lat.Lat[0].Typical, lat.Lat[0].P99, bw.BW[0].MsgRate)
			}
		}
	}
	b.StopTimer()
	median := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	var tab strings.Builder
	fmt.Fprintf(&tab, "64 B SEND over AF_XDP (veth, copy mode), medians of %d interleaved rounds:\n", len(res["daemon"].p50))
	fmt.Fprintf(&tab, "%-10s %12s %12s %12s\n", "", "p50 µs", "p99 µs", "Mpps")
	for _, mode := range []string{"inprocess", "daemon"} {
		f := res[mode]
		fmt.Fprintf(&tab, "%-10s %12.2f %12.2f %12.4f\n", mode, median(f.p50), median(f.p99), median(f.mpps))
	}
	ip, d := res["inprocess"], res["daemon"]
	fmt.Fprintf(&tab, "daemon − in-process: p50 %+.2f µs, rate ×%.2f\n", median(d.p50)-median(ip.p50), median(d.mpps)/median(ip.mpps))
	// On stdout: go test keeps only the first lines of a benchmark's log.
	fmt.Print(tab.String())
	b.ReportMetric(median(ip.p50), "inproc-p50-µs")
	b.ReportMetric(median(d.p50), "daemon-p50-µs")
	b.ReportMetric(median(ip.mpps), "inproc-Mpps")
	b.ReportMetric(median(d.mpps), "daemon-Mpps")
}
