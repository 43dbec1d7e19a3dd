package main

import (
	"strings"
	"testing"
)

func TestParseXFailAndRetries(t *testing.T) {
	const file = `a/{1,2} | mtu=1024 xfail="rxe 6.1 drops it | not ours" | host: softrnic perf write_bw | guest: ib_write_bw
`
	if _, err := ParseCases(strings.NewReader(file)); err == nil {
		t.Fatal("a reason holding the field separator was accepted")
	}
	const ok = `a/{1,2} | mtu=1024 xfail="rxe 6.1 replays it late" retries=2 ip=6 | host: softrnic perf write_bw | guest: ib_write_bw
b | retries=1 | host: softrnic perf write_bw | guest: ib_write_bw
`
	cs, err := ParseCases(strings.NewReader(ok))
	if err != nil {
		t.Fatal(err)
	}
	if cs[1].XFail != "rxe 6.1 replays it late" || cs[1].Retries != 2 || cs[1].IP != 6 {
		t.Fatalf("case %+v", cs[1])
	}
	if cs[2].XFail != "" || cs[2].Retries != 1 {
		t.Fatalf("case %+v", cs[2])
	}
	for _, bad := range []string{`xfail=""`, `xfail="open`, `retries=3`, `retries=-1`, `retries=x`} {
		f := "c | " + bad + " | host: softrnic perf write_bw | guest: ib_write_bw\n"
		if _, err := ParseCases(strings.NewReader(f)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestSplitAttrs(t *testing.T) {
	got, err := splitAttrs(`mtu=1024  xfail="two  words" ip=4`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"mtu=1024", "xfail=two  words", "ip=4"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// Only the lab's own loss may buy a retry: the tap dropped frames and every
// complaint is a recovery counter.
func TestLabLoss(t *testing.T) {
	for _, c := range []struct {
		r    result
		want bool
	}{
		{result{tapDrops: 12, why: []string{"guest guest: completer_retry_err+8"}}, true},
		{result{tapDrops: 3, why: []string{"guest guest: out_of_seq_request+3", "guest guest: duplicate_request+984"}}, true},
		{result{tapDrops: 0, why: []string{"guest guest: completer_retry_err+8"}}, false},
		{result{tapDrops: 5, why: []string{"guest guest: retry_exceeded_err+1"}}, false},
		{result{tapDrops: 5, why: []string{"guest guest: duplicate_request+1", "client (host) exit 1"}}, false},
		{result{tapDrops: 5, why: []string{"pcap check: exit status 1"}}, false},
		{result{tapDrops: 5}, false},
	} {
		if got := labLoss(c.r); got != c.want {
			t.Errorf("labLoss(%+v) = %v, want %v", c.r, got, c.want)
		}
	}
}

func TestMissingFlag(t *testing.T) {
	helps := map[string]string{
		"perf":        "usage: softrnic perf TEST [flags]\n  -d, --ib-dev=IFACE   device\n  -u, --qp-timeout=N   timeout\n  -F                   ignored\n  -s, --size=N         message size\n",
		"rdma_server": "softrnic: flag: help requested\n",
		"rping":       "usage: softrnic rping -s [-a ADDR]\n  -s   server\n  -a ADDR  address\n",
	}
	c := func(cmd string) Case {
		return Case{Server: Side{"host", cmd}, Client: Side{"guest", "ib_write_bw -R"}}
	}
	for _, tc := range []struct{ cmd, want string }{
		{"softrnic perf write_bw -d {iface} -u 18 -F -s 65536 {server}", ""},
		{"softrnic perf write_bw -d {iface} -F -R -m 1024", "-R"},
		{"softrnic perf write_bw --ib-dev=lv0 --rdma_cm", "--rdma_cm"},
		{"softrnic rdma_server -s {server_ip} -p 7471", ""}, // no option list: run it
		{"softrnic rping -s -a {server_ip} -V", "-V"},
		{"softrnic perf write_bw -d {iface} -s -1", ""},
	} {
		if got := missingFlag("/nonexistent", c(tc.cmd), helps); got != tc.want {
			t.Errorf("missingFlag(%q) = %q, want %q", tc.cmd, got, tc.want)
		}
	}
}

func TestParseDropped(t *testing.T) {
	js := `[{"ifindex":2,"ifname":"lt0","txqlen":1000,"stats64":{"rx":{"bytes":1,"packets":2,"dropped":7},"tx":{"bytes":63773991,"packets":59600,"errors":0,"dropped":2613}}}]`
	n, err := parseDropped([]byte(js), "tx")
	if err != nil || n != 2613 {
		t.Fatalf("parseDropped tx = %d, %v; want 2613", n, err)
	}
	if n, err := parseDropped([]byte(js), "rx"); err != nil || n != 7 {
		t.Fatalf("parseDropped rx = %d, %v; want 7", n, err)
	}
	if _, err := parseDropped([]byte(`[]`), "tx"); err == nil {
		t.Fatal("no link accepted")
	}
}
