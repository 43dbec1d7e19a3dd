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

// Structs across packages (the embedding one listed first), packing where
// C's layout differs, typed and 64-bit constants, and what is left out;
// the C compiler checks the emitted assertions.
func TestGenerateFragments(t *testing.T) {
	h, err := Generate("testdata", []string{"./pb=T", "./pa=T"})
	if err != nil {
		t.Fatal(err)
	}
	out := string(h)
	for _, want := range []string{
		"#define SOFTRNIC_T_KIND_K 3",
		"#define SOFTRNIC_T_BIG UINT64_C(0x10000000000)",
		"struct softrnic_t_inner {\n\tuint8_t a;\n\tuint32_t b; // at 1\n} __attribute__((packed));",
		"\tstruct softrnic_t_inner in;",
		"_Static_assert(offsetof(struct softrnic_t_outer, y) == 7,",
		"_Static_assert(sizeof(struct softrnic_t_outer) == 25,",
		"_Static_assert(offsetof(struct softrnic_t_outer, ok) == 24,",
		"struct softrnic_t_natural {\n\tuint32_t a;\n\tuint32_t _pad0;\n\tuint64_t b;\n};",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "skip") || strings.Index(out, "struct softrnic_t_inner {") > strings.Index(out, "struct softrnic_t_outer {") {
		t.Errorf("Skip emitted or Inner after its user:\n%s", out)
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "h.h"), h, 0o644); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "t.c")
	if err := os.WriteFile(src, []byte("#include \"h.h\"\nint main(void) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-o", filepath.Join(dir, "t"), src).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s\n%s", err, b, out)
	}
}
