package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/softrnic/softrnic/daemon/proto"
)

func init() {
	register("run", "run a stock RDMA program (perftest, ibv_*, ...) on the daemon's RNIC", runRun)
}

// The environment the drop-in libraries read: the daemon's control socket
// (SOFTRNIC_CONTROL) and, for diagnostics on stderr, SOFTRNIC_DEBUG.
const controlEnv = "SOFTRNIC_CONTROL"

// libNames are the drop-in libraries, which are loaded together: softrnic's
// librdmacm.so.1 uses its libibverbs.so.1's device and PDs, so a directory
// with only one of them would pair it with rdma-core's other.
var libNames = []string{"libibverbs.so.1", "librdmacm.so.1"}

func runRun(args []string) int {
	fs := flag.NewFlagSet("softrnic run", flag.ContinueOnError)
	control := fs.String("control", "", "the daemon's control socket (default: $"+controlEnv+", else "+proto.DefaultControl+")")
	lib := fs.String("lib", "", "the directory of softrnic's "+strings.Join(libNames, " and ")+" (default: beside the binary, ../lib/softrnic)")
	fs.Usage = func() {
		o := fs.Output()
		fmt.Fprintln(o, "usage: softrnic run [--control PATH] [--lib DIR] -- PROGRAM [ARGS...]")
		fmt.Fprintln(o, "\nRuns PROGRAM, unchanged, with softrnic's "+strings.Join(libNames, " and ")+" in place of rdma-core's, so that")
		fmt.Fprintln(o, "it uses the RNIC of the softrnic daemon at the control socket. PROGRAM replaces this")
		fmt.Fprintln(o, "process: its exit status and the signals sent to it are its own.")
		fs.PrintDefaults()
		fmt.Fprintln(o, "\nThe same without this command: LD_LIBRARY_PATH=DIR "+controlEnv+"=PATH PROGRAM [ARGS...]")
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	dir, err := libDir(*lib)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic run:", err)
		return 1
	}
	path := *control
	if path == "" {
		path = os.Getenv(controlEnv)
	}
	if path == "" {
		path = proto.DefaultControl
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	prog, err := exec.LookPath(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic run:", err)
		return 127
	}
	env := runEnv(os.Environ(), dir, path)
	// Exec rather than a child: the program is the process the caller
	// started, so signals reach it and its exit status is the caller's.
	err = syscall.Exec(prog, fs.Args(), env)
	fmt.Fprintf(os.Stderr, "softrnic run: %s: %v\n", prog, err)
	return 126
}

// runEnv is env with dir first on LD_LIBRARY_PATH and the control socket
// set.
func runEnv(env []string, dir, control string) []string {
	out := make([]string, 0, len(env)+2)
	ldPath := dir
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LD_LIBRARY_PATH="); ok {
			if v != "" {
				ldPath = dir + ":" + v
			}
		} else if !strings.HasPrefix(kv, controlEnv+"=") {
			out = append(out, kv)
		}
	}
	return append(out, "LD_LIBRARY_PATH="+ldPath, controlEnv+"="+control)
}

// libDir finds the directory of the drop-in libraries: the one given, else
// ../lib/softrnic beside the binary (where make install puts them).
func libDir(given string) (string, error) {
	d := given
	if d == "" {
		exe, err := os.Executable()
		if err == nil {
			exe, err = filepath.EvalSymlinks(exe)
		}
		if err != nil {
			return "", err
		}
		d = filepath.Join(filepath.Dir(exe), "..", "lib", "softrnic")
	}
	for _, name := range libNames {
		if _, err := os.Stat(filepath.Join(d, name)); err != nil {
			if given != "" {
				return "", fmt.Errorf("no %s in %s", name, given)
			}
			return "", errors.New("no " + name + " beside the binary (make install puts the libraries in ../lib/softrnic; or give --lib DIR, e.g. c/build/lib after make clib)")
		}
	}
	return filepath.Abs(d)
}
