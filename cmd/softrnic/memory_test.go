package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
)

// withHugePages makes n huge pages available for the test if the system
// has none free, and gives them back after it.
func withHugePages(t *testing.T, n int) {
	const knob = "/proc/sys/vm/nr_hugepages"
	b, err := os.ReadFile(knob)
	if err != nil {
		return
	}
	was, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if free := hugePagesFree(); free >= n {
		return
	}
	if os.WriteFile(knob, []byte(strconv.Itoa(was+n)), 0) != nil {
		return
	}
	t.Cleanup(func() {
		if err := os.WriteFile(knob, []byte(strconv.Itoa(was)), 0); err != nil {
			t.Errorf("restoring %s: %v", knob, err)
		}
	})
}

func hugePagesFree() int {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "HugePages_Free:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// The C memory test program, under AddressSanitizer, through softrnic run:
// every kind of application memory registered and moved between two QPs
// of one daemon (loopback), the registration errors and faults as
// rdma-core over rxe reports them, fork; then a client SIGKILLed while
// it streams WRITEs to a client of another daemon, which goes on working,
// as does the killed client's daemon.
func TestCMemProgram(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	dir := buildCLib(t)
	bin := buildSoftrnic(t)
	withHugePages(t, 4)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sockA, _ := startDaemon(t, bin, pair.A)
	sockB, _ := startDaemon(t, bin, pair.B)
	prog := func(ctx context.Context, asan bool, ns *netnstest.NS, sock string, args ...string) *exec.Cmd {
		test, lib := filepath.Join(dir, "mem_test"), filepath.Join(dir, "lib")
		if asan {
			test, lib = filepath.Join(dir, "asan", "mem_test"), filepath.Join(dir, "asan", "lib")
		}
		return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.Name, bin, "run", "--lib", lib, "--control", sock, "--", test}, args...)...)
	}
	// The suite runs under AddressSanitizer first, and again without it
	// after the kill: a sanitizer's mlock locks nothing, so the locked
	// memory case runs only in the second.
	local := func(asan bool) func(t *testing.T) {
		return func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			out, err := prog(ctx, asan, pair.A.NS, sockA, "local").CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte(" passed, 0 failed")) {
				t.Fatalf("%v\n%s", err, out)
			}
			t.Logf("%s", bytes.ReplaceAll(bytes.TrimSpace(out), []byte("\n"), []byte("; ")))
		}
	}
	t.Run("local", local(true))
	t.Run("killed-mid-transfer", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		var hout bytes.Buffer
		hold := prog(ctx, false, pair.B.NS, sockB, "hold", "18600")
		hold.Stdout, hold.Stderr = &hout, &hout
		if err := hold.Start(); err != nil {
			t.Fatal(err)
		}
		stream := prog(ctx, false, pair.A.NS, sockA, "stream", pair.B.Addr.String(), "18600")
		var serr bytes.Buffer
		stream.Stderr = &serr
		so, err := stream.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(so).ReadString('\n')
		if err != nil || line != "streaming\n" {
			stream.Process.Kill()
			stream.Wait()
			hold.Wait()
			t.Fatalf("streamer: %q %v\n%s\nholder: %s", line, err, serr.String(), hout.String())
		}
		time.Sleep(500 * time.Millisecond) // mid-transfer
		stream.Process.Signal(syscall.SIGKILL)
		stream.Wait()
		if err := hold.Wait(); err != nil || !bytes.Contains(hout.Bytes(), []byte(" passed, 0 failed")) {
			t.Fatalf("the streamer's peer: %v\n%s", err, hout.String())
		}
		t.Logf("peer: %s", lastLine(hout.Bytes()))
	})
	t.Run("daemon-unharmed", local(false))
}
