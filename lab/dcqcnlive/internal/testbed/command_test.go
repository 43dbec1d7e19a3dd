package testbed

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
)

// TestMain lets the test binary stand in for the engine's processes in
// TestCommandEndpoints (TESTBED_HELPER=server|client).
func TestMain(m *testing.M) {
	switch os.Getenv("TESTBED_HELPER") {
	case "server":
		os.Exit(helperServer(os.Args[1:]))
	case "client":
		os.Exit(helperClient(os.Args[1:]))
	case "shared":
		os.Exit(helperShared(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// helperServer: ADDR PORT — accepts one connection, reads a line, prints
// counters as perf --json would.
func helperServer(args []string) int {
	ln, err := net.Listen("tcp", net.JoinHostPort(args[0], args[1]))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := ln.Accept()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	b := make([]byte, 64)
	n, _ := c.Read(b)
	c.Close()
	fmt.Printf("server got %q\n{\"results\": {\"np_ecn_marked_roce_packets\": 40, \"np_cnp_sent\": 7}}\n", b[:n])
	return 0
}

// helperShared: ADDR PORT N — a server for N clients, as perf --clients
// N: accepts N connections, then prints one JSON object per client whose
// dcqcn object names the client's address as its peer, with per-QP counts
// that depend on the peer (100 × its address's third byte + 10 × its last) and
// device-wide mlx5 counters that the testbed must not give to any flow.
func helperShared(args []string) int {
	ln, err := net.Listen("tcp", net.JoinHostPort(args[0], args[1]))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	n, _ := strconv.Atoi(args[2])
	var peers []netip.Addr
	for range n {
		c, err := ln.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		_, _ = c.Read(make([]byte, 64)) // the client's line, whatever it is
		peers = append(peers, c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap())
		c.Close()
	}
	for _, p := range peers {
		k := int(p.As4()[2])*100 + int(p.As4()[3])*10
		fmt.Printf("{\"dcqcn\": {\"np_ecn_marked_roce_packets\": 999, \"np_cnp_sent\": 999, \"peer\": %q, \"qps\": [{\"ecn_marked\": %d, \"cnp_sent\": %d}]}}\n", p, k, k/2)
	}
	return 0
}

// helperClient: SERVER PORT SECS — connects through sw, then prints its
// counters after SECS seconds (or at SIGINT, which ends it with an error).
func helperClient(args []string) int {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(args[0], args[1]), 5*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := c.Write([]byte("hello\n")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c.Close()
	secs, _ := strconv.Atoi(args[2])
	time.Sleep(time.Duration(secs) * time.Second)
	fmt.Println(`not json {`)
	fmt.Println(`{"qps": [{"rp_cnp_handled": 5, "rp_cnp_ignored": 2}, {"rp_cnp_handled": 1}]}`)
	return 0
}

func TestExpand(t *testing.T) {
	h1 := &Host{Name: "h1", Link: netnstest.Link{Name: "va1", Addr: netip.MustParseAddr("10.77.1.2")}}
	r := &Host{Name: "r", Link: netnstest.Link{Name: "vr", Addr: netip.MustParseAddr("10.77.3.2")}}
	spec := FlowSpec{ID: 2, Src: h1, Dst: r, TClass: 26<<2 | 2, CC: "dcqcn:paper", Profile: "paper", Scale: 400, PayloadBytes: 1024, Duration: 25500 * time.Millisecond}
	got := expand(SoftrnicClient, "/opt/softrnic", h1, spec, 18517, 2)
	want := []string{"/opt/softrnic", "perf", "write_bw", "-d", "va1", "-p", "18517", "-D", "26", "-s", "65536", "-m", "1024",
		"-u", "18", "--tclass", "106", "--cc", "dcqcn:paper", "--cc-scale", "400", "--json", "10.77.3.2"}
	if !slices.Equal(got, want) {
		t.Fatalf("client:\n got %q\nwant %q", got, want)
	}
	got = expand(SoftrnicServer, "/opt/softrnic", r, spec, 18516, 2)
	want = []string{"/opt/softrnic", "perf", "write_bw", "-d", "vr", "-p", "18516", "-D", "26", "-s", "65536", "-m", "1024",
		"-u", "18", "--tclass", "106", "--cc", "dcqcn:paper", "--cc-scale", "400", "--json", "--clients", "2"}
	if !slices.Equal(got, want) {
		t.Fatalf("server:\n got %q\nwant %q", got, want)
	}
	if got := expand([]string{"x{dscp}/{addr}/{id}/{clients}"}, "", r, spec, 1, 0); got[0] != "x26/10.77.3.2/2/1" {
		t.Fatalf("got %q", got)
	}
}

// TestAddPeerCounters: a shared server's output gives each flow the
// per-QP counts of the objects naming its sender, never the device-wide
// mlx5 counters (which cover every flow).
func TestAddPeerCounters(t *testing.T) {
	out := []byte(`{"results_bw": [], "dcqcn": {"profile": "paper", "np_cnp_sent": 100, "np_ecn_marked_roce_packets": 300, "peer": "10.77.1.2",
  "qps": [{"qpn": 17, "ecn_marked": 120, "cnp_sent": 40}, {"qpn": 18, "ecn_marked": 5, "cnp_sent": 1, "cnp_handled": 2, "cnp_ignored": 3}]}}
{"dcqcn": {"np_cnp_sent": 100, "peer": "10.77.2.2", "qps": [{"qpn": 19, "ecn_marked": 175, "cnp_sent": 59}]}}
{"test_info": {}}
`)
	var c1, c2, none EndpointCounters
	addPeerCounters(&c1, out, "10.77.1.2")
	addPeerCounters(&c2, out, "10.77.2.2")
	addPeerCounters(&none, out, "10.77.9.9")
	if want := (EndpointCounters{RecvCE: 125, CNPSent: 41, CNPHandled: 2, CNPIgnored: 3}); c1 != want {
		t.Errorf("flow 1: %+v, want %+v", c1, want)
	}
	if want := (EndpointCounters{RecvCE: 175, CNPSent: 59}); c2 != want {
		t.Errorf("flow 2: %+v, want %+v", c2, want)
	}
	if none != (EndpointCounters{}) {
		t.Errorf("unknown peer: %+v", none)
	}
}

func TestAddCounters(t *testing.T) {
	var c EndpointCounters
	addCounters(&c, []byte("noise { not json\n{\"a\": {\"np_cnp_sent\": 3, \"np_ecn_marked_roce_packets\": 9}}\ntext\n[{\"rp_cnp_handled\": 1}] {\"rp_cnp_ignored\": 4, \"rp_cnp_handled\": \"x\"}"))
	want := EndpointCounters{CNPSent: 3, RecvCE: 9, CNPHandled: 1, CNPIgnored: 4}
	if c != want {
		t.Fatalf("got %+v, want %+v", c, want)
	}
}

// TestCommandEndpoints runs a server in r and a client in h1 (this test
// binary standing in for softrnic) and checks placement (the client reaches
// r's address through sw), the counters from both outputs and the bounded
// stop.
func TestCommandEndpoints(t *testing.T) {
	topo := buildTest(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ep := &CommandEndpoints{
		Label:  "helper",
		Server: []string{"env", "TESTBED_HELPER=server", self, "{addr}", "{port}"},
		Client: []string{"env", "TESTBED_HELPER=client", self, "{server}", "{port}", "{secs}"},
	}
	defer ep.Close()
	f, err := ep.StartFlow(topo, FlowSpec{ID: 1, Src: &topo.H1, Dst: &topo.R, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Stop(); err != nil {
		t.Fatal(err)
	}
	want := EndpointCounters{RecvCE: 40, CNPSent: 7, CNPHandled: 6, CNPIgnored: 2}
	if c := f.Counters(); c != want {
		t.Fatalf("counters %+v, want %+v", c, want)
	}
}

// TestSharedServer runs one server in r for two flows (SharedServer, as
// the softrnic endpoints do: only one process may own r's AF_XDP queue)
// and checks that both clients reach it on one port, that it gets
// {clients}, and that each flow's counters are its own client's plus the
// server's per-QP counts for that client's address, never the server's
// device-wide counters.
func TestSharedServer(t *testing.T) {
	topo := buildTest(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ep := &CommandEndpoints{
		Label:        "helper",
		Server:       []string{"env", "TESTBED_HELPER=shared", self, "{addr}", "{port}", "{clients}"},
		Client:       []string{"env", "TESTBED_HELPER=client", self, "{server}", "{port}", "{secs}"},
		SharedServer: true, Clients: 2, BasePort: 19600, LogDir: t.TempDir(),
	}
	defer ep.Close()
	var flows []Flow
	for i, h := range []*Host{&topo.H1, &topo.H2} {
		f, err := ep.StartFlow(topo, FlowSpec{ID: i + 1, Src: h, Dst: &topo.R, Duration: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		flows = append(flows, f)
	}
	for _, f := range flows {
		if err := f.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	for i, h := range []*Host{&topo.H1, &topo.H2} {
		k := uint64(h.Link.Addr.As4()[2])*100 + uint64(h.Link.Addr.As4()[3])*10
		want := EndpointCounters{RecvCE: k, CNPSent: k / 2, CNPHandled: 6, CNPIgnored: 2}
		if c := flows[i].Counters(); c != want {
			t.Errorf("flow %d (%v): counters %+v, want %+v", i+1, h.Link.Addr, c, want)
		}
	}
	for _, name := range []string{"server.out", "client-1.out", "client-2.out"} {
		if b, err := os.ReadFile(ep.LogDir + "/" + name); err != nil || len(b) == 0 {
			t.Errorf("log %s: %v, %d bytes", name, err, len(b))
		}
	}
}

// What the sender's congestion control allowed is summed over its QPs
// from perf's cc object (a window algorithm's rate capped by its window
// over its SRTT), with their counts and figures; α is the largest of the
// dcqcn object's; an older perf's output without a cc object gives the
// dcqcn rates; counters are left alone.
func TestAddSenderRate(t *testing.T) {
	var c EndpointCounters
	addSenderRate(&c, []byte("log line\n{\"dcqcn\": {\"qps\": [{\"rate_mbps\": 48.5, \"alpha\": 0.08}, {\"rate_mbps\": 1.5, \"alpha\": 0.1}]}, \"np_cnp_sent\": 7}\n"))
	if c != (EndpointCounters{RPRateMbps: 50, RPAlpha: 0.1}) {
		t.Fatalf("got %+v", c)
	}
	c = EndpointCounters{}
	addSenderRate(&c, []byte(`{"cc": {"algorithm": "dcqcn", "qps": [{"rate_mbps": 48.5}, {"rate_mbps": 1.5}]}, "dcqcn": {"qps": [{"rate_mbps": 48.5, "alpha": 0.08}, {"rate_mbps": 1.5, "alpha": 0.1}]}}`))
	if c != (EndpointCounters{RPRateMbps: 50, RPAlpha: 0.1}) {
		t.Fatalf("dcqcn with a cc object: got %+v", c)
	}
	c = EndpointCounters{}
	// Swift: a window of 5000 bytes over a 1000 µs SRTT allows 40 Mb/s
	// of the 100 the pacer would.
	addSenderRate(&c, []byte(`{"cc": {"algorithm": "swift", "cc_rtt_samples": 999, "qps": [{"rate_mbps": 100, "window_bytes": 5000, "srtt_us": 1000,
	  "min_rtt_us": 300, "host_delay_us": 20, "rtt_samples": 70, "decreases": 5, "loss_events": 1, "window_full": 60, "cwnd": 4.6, "target_us": 2400}]}}`))
	w := EndpointCounters{RPRateMbps: 40, CCRTTSamples: 70, CCDecreases: 5, CCLossEvents: 1, CCWindowFull: 60, Cwnd: 4.6, SRTTUs: 1000,
		MinRTTUs: 300, HostDelayUs: 20, TargetUs: 2400}
	if c != w {
		t.Fatalf("swift: got %+v, want %+v", c, w)
	}
}
