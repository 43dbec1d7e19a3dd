package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestExpandBraces(t *testing.T) {
	names, choices, err := expandBraces("w/mtu{1024,4096}/v{4,6}")
	if err != nil {
		t.Fatal(err)
	}
	wantNames := []string{"w/mtu1024/v4", "w/mtu1024/v6", "w/mtu4096/v4", "w/mtu4096/v6"}
	if !reflect.DeepEqual(names, wantNames) {
		t.Fatalf("names %q, want %q", names, wantNames)
	}
	if !reflect.DeepEqual(choices[2], []string{"4096", "4"}) {
		t.Fatalf("choices[2] = %q", choices[2])
	}
	for _, bad := range []string{"a{b", "a}b", "a{b,}", "a{{b}}", "{1}{2}{3}{4}{5}{6}{7}{8}{9}{10}"} {
		if _, _, err := expandBraces(bad); err == nil {
			t.Errorf("expandBraces(%q) accepted", bad)
		}
	}
}

func TestParseCases(t *testing.T) {
	const file = `# comment

write_bw/mtu{1024,4096}/s{1,65536} | mtu=$1 ip=6 timeout=30 ready=tcp:18515 | host: softrnic perf write_bw -d {iface} -m $1 -s $2 | guest: ib_write_bw -F -x $GID -m $1 -s $2 {server}
loss{1,5} | loss=$1 expect=loss | guest: ib_read_bw -F | host: softrnic perf read_bw -d {iface} {server} $9
`
	cs, err := ParseCases(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 6 {
		t.Fatalf("%d cases, want 6", len(cs))
	}
	c := cs[1]
	if c.Name != "write_bw/mtu1024/s65536" || c.MTU != 1024 || c.IP != 6 || c.Timeout != 30*time.Second || c.Ready != "tcp:18515" || c.Line != 3 {
		t.Fatalf("case %+v", c)
	}
	if c.Server != (Side{"host", "softrnic perf write_bw -d {iface} -m 1024 -s 65536"}) {
		t.Fatalf("server %+v", c.Server)
	}
	if c.Client != (Side{"guest", "ib_write_bw -F -x $GID -m 1024 -s 65536 {server}"}) {
		t.Fatalf("client %+v", c.Client)
	}
	if c.HostSubcommand() != "perf" || c.NetdevMTU() != 1500 || cs[2].NetdevMTU() != 4200 {
		t.Fatalf("subcommand %q netdev MTUs %d %d", c.HostSubcommand(), c.NetdevMTU(), cs[2].NetdevMTU())
	}
	l := cs[5]
	if l.Name != "loss5" || l.Loss != 5 || l.Expect != "loss" || l.MTU != 1024 || l.IP != 4 || l.Timeout != 60*time.Second {
		t.Fatalf("loss case %+v", l)
	}
	// $9 names no brace group: left for the shell.
	if !strings.HasSuffix(l.Client.Cmd, "{server} $9") {
		t.Fatalf("client %q", l.Client.Cmd)
	}
}

func TestParseCasesRejects(t *testing.T) {
	for _, bad := range []string{
		"a | mtu=1500 | host: x | guest: y",                  // not a path MTU
		"a | ip=5 | host: x | guest: y",                      // no such family
		"a | loss=60 | host: x | guest: y",                   // too much loss
		"a | expect=loss | host: x | guest: y",               // expecting loss without causing it
		"a | timeout=0 | host: x | guest: y",                 // no time limit
		"a | ready=udp:1 | host: x | guest: y",               // unknown readiness
		"a | colour=red | host: x | guest: y",                // unknown attribute
		"a | | host: x | host: y",                            // both sides on one peer
		"a | | moon: x | guest: y",                           // unknown peer
		"a | | host x | guest: y",                            // no PEER:
		"a | | host: x",                                      // missing field
		"a | | host: x | guest: y\na | | host: x | guest: y", // duplicate name
	} {
		if _, err := ParseCases(strings.NewReader(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

// TestCaseFiles parses the committed case files: a typo there must fail
// here, not in CI after a 20-minute boot.
func TestCaseFiles(t *testing.T) {
	for file, peers := range map[string][2]string{"cases.txt": {"host", "guest"}, "selfcheck.txt": {"a", "b"}} {
		f, err := os.Open(filepath.Join(".", file))
		if err != nil {
			t.Fatal(err)
		}
		cs, err := ParseCases(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(cs) == 0 {
			t.Fatalf("%s: no cases", file)
		}
		for _, c := range cs {
			for _, s := range []Side{c.Server, c.Client} {
				if s.Peer != peers[0] && s.Peer != peers[1] {
					t.Errorf("%s: %s: peer %q", file, c.Name, s.Peer)
				}
			}
			if c.Ready == "" {
				t.Errorf("%s: %s: no ready= (how would the client know the server is up?)", file, c.Name)
			}
		}
	}
}

func TestFilter(t *testing.T) {
	cs := []Case{{Name: "write_bw/a"}, {Name: "read_bw/a"}, {Name: "write_lat/b"}}
	got, err := Filter(cs, "^write_")
	if err != nil || len(got) != 2 || got[1].Name != "write_lat/b" {
		t.Fatalf("Filter: %v %+v", err, got)
	}
	if _, err := Filter(cs, "("); err == nil {
		t.Fatal("bad regexp accepted")
	}
}

func TestCheckCounters(t *testing.T) {
	before, err := ParseCounters(strings.NewReader("sent_pkts 10\nrcvd_seq_err 1\nduplicate_request 0\nretry_exceeded_err 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	after, _ := ParseCounters(strings.NewReader("sent_pkts 110\nrcvd_seq_err 3\nduplicate_request 0\nretry_exceeded_err 0\n"))
	d := Delta(before, after)
	if d["sent_pkts"] != 100 || d["rcvd_seq_err"] != 2 {
		t.Fatalf("delta %v", d)
	}
	if p, rec := CheckCounters(d, "", false, nil); len(p) != 1 || p[0] != "rcvd_seq_err+2" || rec != 2 {
		t.Fatalf("clean case: problems %q recovery %d", p, rec)
	}
	if p, rec := CheckCounters(d, "", true, nil); len(p) != 0 || rec != 2 {
		t.Fatalf("loss case: problems %q recovery %d", p, rec)
	}
	if p, _ := CheckCounters(d, "", false, map[string]bool{"completer_retry_err": true}); len(p) != 1 {
		t.Fatalf("allowing retries must not allow a NAK sequence error: %q", p)
	}
	if p, _ := CheckCounters(Counters{"completer_retry_err": 2, "duplicate_request": 3}, "", false,
		map[string]bool{"completer_retry_err": true, "duplicate_request": true}); len(p) != 0 {
		t.Fatalf("allowed counters reported: %q", p)
	}
	d["retry_exceeded_err"] = 1
	if p, _ := CheckCounters(d, "", true, nil); len(p) != 1 || p[0] != "retry_exceeded_err+1" {
		t.Fatalf("retry exceeded under loss must fail: %q", p)
	}
	if p, _ := CheckCounters(Counters{}, "[ 1.0] rdma_rxe: bad ICRC from 10.77.0.254\n", false, nil); len(p) != 1 {
		t.Fatalf("ICRC message not caught: %q", p)
	}
	if p, _ := CheckCounters(Counters{}, "[ 2.0] rdma_rxe: no qp matches qpn 0x99\n", false, nil); len(p) != 1 {
		t.Fatalf("unknown-QP drop not caught: %q", p)
	}
	if p, _ := CheckCounters(Counters{}, "[ 2.0] eth0 speed is unknown, defaulting to 1000\n", false, nil); len(p) != 0 {
		t.Fatalf("benign kernel message reported: %q", p)
	}
	// The guest's qdisc drops (the READ-reply gap's cause: CoDel dropped
	// rxe's responses after rxe counted them sent) fail a clean case and
	// are expected in a loss case, where netem drops on purpose.
	if p, _ := CheckCounters(Counters{egressDropped: 41, "duplicate_request": 30}, "", false,
		map[string]bool{"duplicate_request": true}); len(p) != 1 || !strings.Contains(p[0], "qdisc dropped 41") {
		t.Fatalf("egress qdisc drops not reported: %q", p)
	}
	if p, _ := CheckCounters(Counters{egressDropped: 41, "duplicate_request": 30}, "", true, nil); len(p) != 0 {
		t.Fatalf("netem's drops reported in a loss case: %q", p)
	}
	if _, err := ParseCounters(strings.NewReader("sent_pkts x\n")); err == nil {
		t.Fatal("bad counter value accepted")
	}
}

func TestTCPListeningParse(t *testing.T) {
	// Our own process has no listener on port 1 (needs root to bind): the
	// reader must say no rather than fail.
	if tcpListening(os.Getpid(), 1) {
		t.Fatal("port 1 reported listening")
	}
}

// TestExplainDuplicates: rxe's duplicate requests are explained up to what
// the case's softrnic hosts say they retransmitted, shared between guests;
// any beyond that still fails the case.
func TestExplainDuplicates(t *testing.T) {
	lines := `{"interface":"lv0","pid":1,"recovery":{"retrans_packets":5,"tlp_probes":2}}
{"interface":"lv0","pid":2,"recovery":{"retrans_packets":3}}
`
	n, ok, err := ReadRetransmitted(strings.NewReader(lines))
	if n != 8 || !ok || err != nil {
		t.Fatalf("read %d %v %v, want 8", n, ok, err)
	}
	if _, ok, _ := ReadRetransmitted(strings.NewReader("")); ok {
		t.Fatal("an empty file counts as a host's report")
	}
	if _, _, err := ReadRetransmitted(strings.NewReader("{bad\n")); err == nil {
		t.Fatal("a bad line is accepted")
	}
	budget := n
	a := Counters{"duplicate_request": 6}
	if e := ExplainDuplicates(a, &budget); e != 6 || budget != 2 {
		t.Fatalf("explained %d, budget left %d", e, budget)
	}
	if p, _ := CheckCounters(a, "", false, nil); len(p) != 0 {
		t.Fatalf("explained duplicates still fail: %v", p)
	}
	b := Counters{"duplicate_request": 5}
	if e := ExplainDuplicates(b, &budget); e != 2 || budget != 0 {
		t.Fatalf("second guest: explained %d, budget left %d", e, budget)
	}
	if p, _ := CheckCounters(b, "", false, nil); len(p) != 1 || p[0] != "duplicate_request+3" {
		t.Fatalf("duplicates beyond softrnic's retransmissions: %v", p)
	}
}
