package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// directive finds the go:generate line that runs cgen in the protocol
// package and returns its arguments and output path, so that the test
// checks exactly what go generate writes.
func directive(t *testing.T, dir string) (out string, args []string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			rest, ok := strings.CutPrefix(sc.Text(), "//go:generate go run ../../internal/cgen ")
			if !ok {
				continue
			}
			f := strings.Fields(rest)
			if len(f) < 3 || f[0] != "-o" {
				t.Fatalf("unexpected directive %q", sc.Text())
			}
			return f[1], f[2:]
		}
	}
	t.Fatalf("no cgen go:generate directive in %s", dir)
	return "", nil
}

// The checked-in header is what the generator makes of the Go
// declarations today: change daemon/proto, shmring or the WR vocabulary
// without `go generate ./daemon/proto` and this fails.
func TestHeaderUpToDate(t *testing.T) {
	dir := filepath.Join("..", "..", "daemon", "proto")
	out, args := directive(t, dir)
	got, err := Generate(dir, args)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(dir, out))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run go generate ./daemon/proto", out)
	}
}

// The header compiles, and its static assertions (sizes and offsets of
// every struct) hold for the C compiler.
func TestHeaderCompiles(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	src := filepath.Join(t.TempDir(), "t.c")
	if err := os.WriteFile(src, []byte("#include \"softrnic_proto.h\"\nint main(void) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	inc, _ := filepath.Abs(filepath.Join("..", "..", "c", "include"))
	cmd := exec.Command(cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", inc, "-o", filepath.Join(t.TempDir(), "t"), src)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
}

func TestWords(t *testing.T) {
	for in, want := range map[string]string{
		"QPAttrMask": "qp_attr_mask", "GIDs": "gids", "NodeGUID": "node_guid", "CMConnReq": "cm_conn_req",
		"SrcIP": "src_ip", "OpOpen": "op_open", "HeaderSize": "header_size", "MaxQPWR": "max_qpwr",
	} {
		if got := snake(in); got != want {
			t.Errorf("snake(%q) = %q, want %q", in, got, want)
		}
	}
	for _, c := range [][3]string{{"Op", "OpOpen", "OpOpen"}, {"WCOpcode", "WCSend", "WCOpcodeSend"}, {"QPState", "Reset", "QPStateReset"}, {"WCOpcode", "WCRDMAWrite", "WCOpcodeRDMAWrite"}, {"QPAttrMask", "AttrState", "QPAttrMaskState"}} {
		if got := joinNames(c[0], c[1]); got != c[2] {
			t.Errorf("joinNames(%q, %q) = %q, want %q", c[0], c[1], got, c[2])
		}
	}
}
