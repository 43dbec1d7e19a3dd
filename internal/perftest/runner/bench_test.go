package runner

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/internal/perftest"
)

// vethRun runs one softrnic perf test between two namespaces over veth on
// AF_XDP and returns the client's result.
func vethRun(tb testing.TB, pair *netnstest.Pair, verb perftest.Verb, m perftest.Measure, args ...string) Result {
	tb.Helper()
	ps, err := perftest.ParseArgs(verb, m, append([]string{"-d", pair.A.Name, "--json"}, args...))
	if err != nil {
		tb.Fatal(err)
	}
	pc, err := perftest.ParseArgs(verb, m, append([]string{"-d", pair.B.Name, "--json", pair.A.Addr.String()}, args...))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var sout, cout bytes.Buffer
	listening := make(chan struct{})
	serr := make(chan error, 1)
	go func() {
		serr <- pair.A.NS.Do(func() error {
			_, err := RunCLI(ctx, ps, CLIOptions{PortKind: host.AFXDP, Listening: func(net.Addr) { close(listening) }}, &sout)
			return err
		})
	}()
	select {
	case <-listening:
	case err := <-serr:
		tb.Fatalf("server: %v", err)
	}
	var res Result
	cerr := pair.B.NS.Do(func() (err error) {
		res, err = RunCLI(ctx, pc, CLIOptions{PortKind: host.AFXDP, DialFor: 5 * time.Second}, &cout)
		return err
	})
	if cerr != nil {
		cancel()
	}
	if err := <-serr; err != nil || cerr != nil {
		tb.Fatalf("server: %v, client: %v", err, cerr)
	}
	return res
}

// BenchmarkPerfVeth measures softrnic against itself between two
// namespaces over veth on AF_XDP (copy mode: veth has no zero-copy), the
// figures of the "data path" bench table: RC WRITE goodput at 64 KiB with
// 1 and 4 QPs, SEND 64 B message rate, SEND 64 B half round trip (perftest's
// typical = median, and p99). Run with -benchtime=1x: each iteration is a
// whole perftest run. Root only.
func BenchmarkPerfVeth(b *testing.B) {
	pair := netnstest.NewTestPair(b, netnstest.PairOptions{MTU: 4200})
	b.Run("write_bw_64KiB_1QP", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			r := vethRun(b, pair, perftest.Write, perftest.BW, "-s", "65536", "-n", "5000", "--report_gbits")
			b.ReportMetric(r.BW[0].AvgBW, "Gb/s")
			b.ReportMetric(r.BW[0].PeakBW, "peak-Gb/s")
		}
	})
	b.Run("write_bw_64KiB_4QP", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			r := vethRun(b, pair, perftest.Write, perftest.BW, "-s", "65536", "-n", "2000", "-q", "4", "--report_gbits")
			b.ReportMetric(r.BW[0].AvgBW, "Gb/s")
		}
	})
	b.Run("send_bw_64B", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			r := vethRun(b, pair, perftest.Send, perftest.BW, "-s", "64", "-n", "100000")
			b.ReportMetric(r.BW[0].MsgRate, "Mpps")
		}
	})
	b.Run("send_lat_64B", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			r := vethRun(b, pair, perftest.Send, perftest.Latency, "-s", "64", "-n", "10000")
			b.ReportMetric(r.Lat[0].Typical, "p50-µs")
			b.ReportMetric(r.Lat[0].P99, "p99-µs")
		}
	})
}
