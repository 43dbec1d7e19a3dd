package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// ipCmd runs `ip ARGS...` and returns its error with ip's own message.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// nsExec runs a command inside namespace ns and waits for it.
func nsExec(ns string, args ...string) error {
	return ipCmd(append([]string{"netns", "exec", ns}, args...)...)
}

// A HostJob is a command run by bash inside the test's namespace, in a
// process group of its own so that it and everything it started can be
// killed together.
type HostJob struct {
	cmd   *exec.Cmd
	done  chan struct{}
	out   string
	limit time.Duration
	ready string
	// timedOut is set when the case's limit killed the job: Wait then
	// reports 124 as timeout(1) does in the guest.
	timedOut atomic.Bool
}

func startHost(ns, outPath, shellCmd string, env []string, c *Case, ready string) (*HostJob, error) {
	f, err := os.Create(outPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", "netns", "exec", ns, "bash", "-c", shellCmd)
	cmd.Env = env
	cmd.Dir = filepath.Dir(outPath)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// The job writes its output through its own descriptor: closing ours
	// loses nothing.
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, err
	}
	j := &HostJob{cmd: cmd, done: make(chan struct{}), out: outPath, limit: c.Timeout, ready: ready}
	go func() {
		_ = cmd.Wait() // Wait reads the exit code from ProcessState
		_ = f.Close()
		close(j.done)
	}()
	go func() { // the case's time limit, as timeout(1) does in the guest
		select {
		case <-j.done:
		case <-time.After(c.Timeout):
			j.timedOut.Store(true)
			j.Kill()
		}
	}()
	return j, nil
}

// WaitReady waits for the host server: a listening TCP port (read from the
// job's own /proc/PID/net, which is its namespace's view), or a fixed delay.
// rdma_cm listeners on the host are softrnic's own and not visible to the
// kernel, so "cm:" waits a second.
func (j *HostJob) WaitReady() error {
	kind, arg, _ := strings.Cut(j.ready, ":")
	switch kind {
	case "tcp":
		port, _ := strconv.Atoi(arg)
		deadline := time.Now().Add(j.limit)
		for time.Now().Before(deadline) {
			select {
			case <-j.done:
				return nil // Wait reports how it ended
			default:
			}
			if tcpListening(j.cmd.Process.Pid, port) {
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
		return fmt.Errorf("host server not listening on TCP %d after %v", port, j.limit)
	case "delay":
		d, _ := strconv.ParseFloat(arg, 64)
		time.Sleep(time.Duration(d * float64(time.Second)))
	case "cm":
		time.Sleep(time.Second)
	}
	return nil
}

// tcpListening looks for a listening socket on port in the network
// namespace of process pid (its children share it).
func tcpListening(pid, port int) bool {
	want := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n")[1:] {
			fl := strings.Fields(l)
			if len(fl) > 3 && strings.HasSuffix(fl[1], want) && fl[3] == "0A" {
				return true
			}
		}
	}
	return false
}

// Wait returns the exit status (-1 when killed by a signal).
func (j *HostJob) Wait() (int, error) {
	select {
	case <-j.done:
	case <-time.After(j.limit + 10*time.Second):
		j.Kill()
		<-j.done
	}
	if j.timedOut.Load() {
		return 124, nil
	}
	return j.cmd.ProcessState.ExitCode(), nil
}

// Kill ends the job's whole process group.
func (j *HostJob) Kill() {
	// Kill fails only for a group that has exited: j.done says.
	_ = syscall.Kill(-j.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-j.done:
	case <-time.After(2 * time.Second):
		_ = syscall.Kill(-j.cmd.Process.Pid, syscall.SIGKILL)
	}
}

func (j *HostJob) stop() { j.Kill() }

func (j *HostJob) Output() string {
	b, _ := os.ReadFile(j.out)
	return string(b)
}

// A Capture is tcpdump writing a case's RoCEv2 frames (UDP 4791, whole
// frames so every ICRC can be checked) to a pcap file.
type Capture struct {
	cmd  *exec.Cmd
	done chan struct{}
	Path string
}

// maxCapturePackets bounds a capture whatever the case does.
const maxCapturePackets = 2000000

func startCapture(ns, iface, path string) (*Capture, error) {
	// --immediate-mode: with TPACKET_V3 tcpdump otherwise reads the kernel's
	// ring a block at a time, and the frames of a short case still sitting
	// in an unfinished block when it is stopped never reach the file.
	cmd := exec.Command("ip", "netns", "exec", ns, "tcpdump", "--immediate-mode", "-i", iface, "-w", path, "-U", "-s", "0",
		"-c", strconv.Itoa(maxCapturePackets), "udp", "port", "4791")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &Capture{cmd: cmd, done: make(chan struct{}), Path: path}
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			if !once && strings.Contains(sc.Text(), "listening on") {
				close(listening)
				once = true
			}
		}
		_, _ = io.Copy(io.Discard, stderr) // the rest, unread, so that tcpdump never blocks
		_ = cmd.Wait()                     // stopped by a signal: its status says only that
		close(c.done)
	}()
	select {
	case <-listening:
		return c, nil
	case <-c.done:
		return nil, fmt.Errorf("tcpdump on %s exited at start", iface)
	case <-time.After(10 * time.Second):
		c.Stop()
		return nil, fmt.Errorf("tcpdump on %s did not start", iface)
	}
}

func (c *Capture) stop() { c.Stop() }

// Stop ends the capture, letting tcpdump flush its file. tcpdump may still
// be behind the kernel's ring when the case ends, and on SIGINT it exits
// without reading what is left: first wait until the file (written per
// packet, -U) has stopped growing for a while.
func (c *Capture) Stop() {
	var last int64 = -1
	still := 0
	for i := 0; i < 100 && still < 5; i++ { // at most ~10 s
		fi, err := os.Stat(c.Path)
		if err != nil {
			break
		}
		if fi.Size() == last {
			still++
		} else {
			still, last = 0, fi.Size()
		}
		select {
		case <-c.done:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Kill fails only for a group that has exited: c.done says.
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
	}
}

// softrnicCommands lists the subcommands the softrnic binary registers, read
// from its usage text, so that a case whose host side needs a subcommand that
// has not landed yet is skipped rather than failed.
func softrnicCommands(bin string) (map[string]bool, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bin).CombinedOutput() // exits 2 with usage
	cmds := map[string]bool{}
	in := false
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "commands:") {
			in = true
			continue
		}
		if in && strings.HasPrefix(l, "  ") {
			if f := strings.Fields(l); len(f) > 0 {
				cmds[f[0]] = true
			}
		}
	}
	return cmds, nil
}

// softrnicHelp is the help text of one softrnic subcommand ("softrnic SUB
// -h"), or "" when it prints none.
func softrnicHelp(bin, sub string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bin, sub, "-h").CombinedOutput() // usage may exit non-zero
	return string(out)
}
