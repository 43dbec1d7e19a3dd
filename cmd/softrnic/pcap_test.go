package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/frame/frametest"
)

func runPcapTest(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = pcapMain(args, &o, &e)
	return code, o.String(), e.String()
}

func vectorFiles(t *testing.T) []string {
	dir := frametest.VectorsDir(t)
	m, _ := filepath.Glob(filepath.Join(dir, "*.pcap"))
	if len(m) == 0 {
		t.Skipf("no captures in %s", dir)
	}
	sort.Strings(m)
	return m
}

// allowedKeys are the keys a JSON frame object may have.
var allowedKeys = map[string]bool{
	"frame": true, "src": true, "dst": true, "udp_sport": true, "opcode": true, "opcode_name": true,
	"dest_qp": true, "psn": true, "ack_req": true, "se": true, "pad": true, "pkey": true, "fecn": true,
	"becn": true, "reth": true, "aeth": true, "deth": true, "imm": true, "ieth": true, "atomic": true,
	"atomic_ack": true, "payload_len": true, "icrc": true,
}

func TestPcapJSONVectors(t *testing.T) {
	files := vectorFiles(t)
	code, out, errs := runPcapTest(t, append([]string{"--json"}, files...)...)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
	var n int
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		for k := range m {
			if !allowedKeys[k] {
				t.Fatalf("key %q not allowed: %s", k, sc.Text())
			}
		}
		if m["icrc"] != "ok" {
			t.Errorf("icrc %v: %s", m["icrc"], sc.Text())
		}
		name := m["opcode_name"].(string)
		if bth.Opcode(m["opcode"].(float64)).String() != name {
			t.Errorf("opcode and name disagree: %s", sc.Text())
		}
		switch name {
		case "RC_ACKNOWLEDGE":
			a := m["aeth"].(map[string]any)
			seen[a["kind"].(string)] = true
			if a["kind"] == "RNR_NAK" && (a["code"].(float64) != 12 || a["syndrome"].(float64) != 0x2c) {
				t.Errorf("RNR NAK: %s", sc.Text())
			}
		case "UD_SEND_ONLY":
			if d := m["deth"].(map[string]any); d["qkey"].(float64) != 0x11111111 && d["qkey"].(float64) != bth.GSIQKey {
				t.Errorf("UD Q_Key: %s", sc.Text())
			}
		case "RC_FETCH_ADD":
			if a := m["atomic"].(map[string]any); a["swap_add"].(float64) != 1 {
				t.Errorf("fetch-add: %s", sc.Text())
			}
		case "RC_ATOMIC_ACKNOWLEDGE":
			if _, ok := m["atomic_ack"].(map[string]any)["orig"]; !ok {
				t.Errorf("atomic ack: %s", sc.Text())
			}
		case "RC_RDMA_WRITE_FIRST":
			if r := m["reth"].(map[string]any); r["len"].(float64) == 0 {
				t.Errorf("write first: %s", sc.Text())
			}
		}
		seen[name] = true
		n++
	}
	if n != 3562 {
		t.Errorf("%d JSON frames, want the 3562 RoCE frames of the vectors", n)
	}
	for _, want := range []string{"ACK", "RNR_NAK", "NAK", "UD_SEND_ONLY", "RC_FETCH_ADD", "RC_RDMA_READ_RESPONSE_MIDDLE", "RC_SEND_ONLY", "RC_RDMA_WRITE_ONLY"} {
		if !seen[want] {
			t.Errorf("never saw %s", want)
		}
	}
	if !strings.Contains(errs, "total: 3562 RoCE frames: icrc ok 3562, bad 0;") {
		t.Errorf("summary on stderr:\n%s", errs)
	}
}

func TestPcapTextVector(t *testing.T) {
	files := vectorFiles(t)
	var rnr string
	for _, f := range files {
		if filepath.Base(f) == "rnr_nak.pcap" {
			rnr = f
		}
	}
	if rnr == "" {
		t.Skip("rnr_nak.pcap absent")
	}
	code, out, _ := runPcapTest(t, rnr)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 149 {
		t.Errorf("%d lines, want 148 frames and a summary", len(lines))
	}
	if !strings.Contains(out, "aeth[RNR_NAK timer=12 (640µs) msn=") || !strings.Contains(out, "aeth[NAK PSN_SEQUENCE_ERROR") {
		t.Errorf("RNR NAK / NAK lines missing")
	}
	if want := rnr + ": 148 RoCE frames: icrc ok 148, bad 0; 31 other frames skipped; 179 frames in all"; lines[len(lines)-1] != want {
		t.Errorf("summary %q, want %q", lines[len(lines)-1], want)
	}
}

// builtFrames makes a small capture of our own: a WRITE FIRST, a UD send
// with immediate over IPv6, an ACK and an ARP-like non-RoCE frame.
func builtFrames(t *testing.T) [][]byte {
	t.Helper()
	mk := func(s frame.Spec, pay []byte) []byte {
		buf := make([]byte, 2048)
		n, err := frame.Build(buf, &s, pay)
		if err != nil {
			t.Fatal(err)
		}
		return buf[:n]
	}
	v4s, v4d := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	w := mk(frame.Spec{Src: v4s, Dst: v4d, SrcPort: 49152,
		BTH:  bth.BTHFields{Opcode: bth.RCRDMAWriteFirst, PKey: 0xFFFF, DestQP: 0x11, PSN: 100},
		RETH: frame.RETHFields{VA: 0x1000, RKey: 0xABC, DMALen: 2048}}, make([]byte, 1024))
	u := mk(frame.Spec{Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8::2"), SrcPort: 7,
		BTH:  bth.BTHFields{Opcode: bth.UDSendOnlyImm, PKey: 0xFFFF, DestQP: 0x12, PSN: 3, SE: true},
		DETH: frame.DETHFields{QKey: 0x11111111, SrcQP: 0x13}, Imm: 0xCAFEF00D}, []byte("hello"))
	a := mk(frame.Spec{Src: v4d, Dst: v4s, SrcPort: 49152,
		BTH:  bth.BTHFields{Opcode: bth.RCAcknowledge, PKey: 0xFFFF, DestQP: 0x11, PSN: 100},
		AETH: frame.AETHFields{Syndrome: bth.NAKSyndrome(bth.NAKRemoteAccessError), MSN: 9}}, nil)
	arp := make([]byte, 60)
	arp[12], arp[13] = 0x08, 0x06
	return [][]byte{w, u, a, arp}
}

func writeCapture(t *testing.T, name string, frames [][]byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := frametest.WritePcap(f, frames); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPcapBuiltText(t *testing.T) {
	p := writeCapture(t, "built.pcap", builtFrames(t))
	code, out, errs := runPcapTest(t, p)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	want := []string{
		"    1 192.0.2.1:49152 -> 192.0.2.2 RC_RDMA_WRITE_FIRST qp=0x000011 psn=100 ack_req=0 reth[va=0x1000 rkey=0x00000abc len=2048] payload=1024 icrc=ok",
		"    2 [2001:db8::1]:7 -> 2001:db8::2 UD_SEND_ONLY_WITH_IMMEDIATE qp=0x000012 psn=3 ack_req=0 se=1 deth[qkey=0x11111111 src_qp=0x000013] imm=0xcafef00d pad=3 payload=5 icrc=ok",
		"    3 192.0.2.2:49152 -> 192.0.2.1 RC_ACKNOWLEDGE qp=0x000011 psn=100 ack_req=0 aeth[NAK REMOTE_ACCESS_ERROR msn=9] payload=0 icrc=ok",
		p + ": 3 RoCE frames: icrc ok 3, bad 0; 1 other frames skipped; 4 frames in all",
	}
	if got := strings.Split(strings.TrimRight(out, "\n"), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("output\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestPcapCorruptedFrame: one payload byte changed → icrc=bad, exit 1.
func TestPcapCorruptedFrame(t *testing.T) {
	frames := builtFrames(t)
	frames[0][100] ^= 0x40
	p := writeCapture(t, "corrupt.pcap", frames)
	code, out, _ := runPcapTest(t, p)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, out)
	}
	if !strings.Contains(out, "RC_RDMA_WRITE_FIRST") || !strings.Contains(out, "icrc=bad") || !strings.Contains(out, "icrc ok 2, bad 1") {
		t.Errorf("output:\n%s", out)
	}
	code, out, _ = runPcapTest(t, "--json", p)
	if code != 1 || !strings.Contains(out, `"opcode_name":"RC_RDMA_WRITE_FIRST"`) || !strings.Contains(out, `"icrc":"bad"`) {
		t.Errorf("json: exit %d\n%s", code, out)
	}
}

// TestPcapMalformedFrame: a RoCE frame whose BTH says TVer 1 is reported and
// fails the run.
func TestPcapMalformedFrame(t *testing.T) {
	frames := builtFrames(t)
	frames[2][14+20+8+1] |= 1
	p := writeCapture(t, "malformed.pcap", frames)
	code, out, _ := runPcapTest(t, p)
	if code != 1 || !strings.Contains(out, "3 malformed RoCEv2: BTH TVer is not 0") || !strings.Contains(out, "malformed 1") {
		t.Errorf("exit %d\n%s", code, out)
	}
	code, out, errs := runPcapTest(t, p, "--json")
	if code != 1 || strings.Contains(out, "malformed") || !strings.Contains(errs, "frame 3: malformed RoCEv2") {
		t.Errorf("json: exit %d\nstdout %s\nstderr %s", code, out, errs)
	}
}

func TestPcapUnreadable(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pcap")
	code, out, errs := runPcapTest(t, missing)
	if code != 2 || !strings.Contains(errs, "missing.pcap") || !strings.Contains(errs, "no such file") || out != "" {
		t.Errorf("missing file: exit %d, %s, stdout %q", code, errs, out)
	}
	junk := filepath.Join(dir, "junk.pcap")
	if err := os.WriteFile(junk, []byte("this is not a capture file at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runPcapTest(t, junk)
	if code != 2 || !strings.Contains(errs, "not a pcap or pcapng file") {
		t.Errorf("junk file: exit %d, %s", code, errs)
	}
	// A readable file beside an unreadable one: both reported, exit 2.
	good := writeCapture(t, "good.pcap", builtFrames(t))
	code, out, _ = runPcapTest(t, good, missing)
	if code != 2 || !strings.Contains(out, "==> "+good+" <==") || !strings.Contains(out, "total: 3 RoCE frames") {
		t.Errorf("mixed: exit %d\n%s", code, out)
	}
	if code, _, _ := runPcapTest(t); code != 2 {
		t.Errorf("no files: exit %d", code)
	}
	if code, _, _ := runPcapTest(t, "--bogus", good); code != 2 {
		t.Errorf("bad flag: exit %d", code)
	}
}

// TestPcapNgAndCookedCaptures: the same frames in pcapng, Linux cooked (SLL)
// and raw-IP captures decode the same.
func TestPcapNgAndCookedCaptures(t *testing.T) {
	frames := builtFrames(t)[:3]
	dir := t.TempDir()
	ci := func(n int) gopacket.CaptureInfo {
		return gopacket.CaptureInfo{Timestamp: time.Unix(1, 0), CaptureLength: n, Length: n}
	}

	ng := filepath.Join(dir, "eth.pcapng")
	f, _ := os.Create(ng)
	w, err := pcapgo.NewNgWriter(f, layers.LinkTypeEthernet)
	if err != nil {
		t.Fatal(err)
	}
	for _, fr := range frames {
		if err := w.WritePacket(ci(len(fr)), fr); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	sll := filepath.Join(dir, "sll.pcap")
	f, _ = os.Create(sll)
	pw := pcapgo.NewWriter(f)
	if err := pw.WriteFileHeader(65535, layers.LinkTypeLinuxSLL); err != nil {
		t.Fatal(err)
	}
	for _, fr := range frames {
		rec := append(make([]byte, 14), fr[12:]...) // 16-byte SLL header: protocol last
		if err := pw.WritePacket(ci(len(rec)), rec); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	raw := filepath.Join(dir, "raw.pcap")
	f, _ = os.Create(raw)
	pw = pcapgo.NewWriter(f)
	if err := pw.WriteFileHeader(65535, layers.LinkTypeRaw); err != nil {
		t.Fatal(err)
	}
	for _, fr := range frames {
		if err := pw.WritePacket(ci(len(fr)-14), fr[14:]); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	for _, p := range []string{ng, sll, raw} {
		code, out, errs := runPcapTest(t, p)
		if code != 0 || !strings.Contains(out, ": 3 RoCE frames: icrc ok 3, bad 0; 0 other") ||
			!strings.Contains(out, "UD_SEND_ONLY_WITH_IMMEDIATE") {
			t.Errorf("%s: exit %d\n%s\n%s", filepath.Base(p), code, out, errs)
		}
	}
}

// TestPcapSnapLength: a RoCE frame cut by the capture's snap length is
// counted as unchecked, not as bad.
func TestPcapSnapLength(t *testing.T) {
	fr := builtFrames(t)[0]
	p := filepath.Join(t.TempDir(), "snap.pcap")
	f, _ := os.Create(p)
	pw := pcapgo.NewWriter(f)
	if err := pw.WriteFileHeader(128, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	if err := pw.WritePacket(gopacket.CaptureInfo{Timestamp: time.Unix(1, 0), CaptureLength: 128, Length: len(fr)}, fr[:128]); err != nil {
		t.Fatal(err)
	}
	f.Close()
	code, out, errs := runPcapTest(t, p)
	if code != 0 || !strings.Contains(out, "cut by snap length (unchecked) 1") || !strings.Contains(errs, "snap length") {
		t.Errorf("exit %d\n%s\n%s", code, out, errs)
	}
}
