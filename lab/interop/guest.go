package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A Guest is one qemu VM running the Debian kernel's rdma_rxe, booted once
// per run and fed jobs through its 9p share (see lab/guest/init for the
// guest's half of the protocol).
type Guest struct {
	Name  string
	Share string // host directory shared as 9p tag "lab"
	IP4   string // without prefix length
	IP6   string
	MAC   string
	Tap   string // tap device in the namespace, created before boot

	GID4, GID6 string // GID indexes the guest found (from its info file)
	Kernel     string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // qemu's exit, valid after done is closed
	next int
}

// Boot starts qemu inside namespace ns and waits until the guest reports
// rxe0 ACTIVE. TCG always: KVM is used only when /dev/kvm opens and the CPU
// has vmx/svm (pitfall 1 of the lab notes: a PVM host advertises /dev/kvm
// yet stock kernels never boot under it).
func (g *Guest) Boot(ns, kernel, initrd string, mtu int, timeout time.Duration) error {
	// A share left by an earlier run into the same -out (its "booted",
	// "quit" and job files) would fool both sides: start empty.
	if err := os.RemoveAll(g.Share); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(g.Share, "job"), 0o755); err != nil {
		return err
	}
	accel := "tcg"
	if kvmUsable() {
		accel = "kvm"
	}
	args := []string{"netns", "exec", ns, "qemu-system-x86_64",
		"-accel", accel, "-m", "1024", "-smp", "1",
		"-nodefaults", "-no-user-config", "-no-reboot",
		"-kernel", kernel, "-initrd", initrd,
		"-append", fmt.Sprintf("console=ttyS0 panic=-1 quiet lab.name=%s lab.ip4=%s/24 lab.ip6=%s/64 lab.mtu=%d",
			g.Name, g.IP4, g.IP6, mtu),
		// vnet_hdr=off keeps frames real on the tap: no GSO, real checksums,
		// which is what XDP and the captures must see.
		"-netdev", fmt.Sprintf("tap,id=n0,ifname=%s,script=no,downscript=no,vnet_hdr=off", g.Tap),
		"-device", "virtio-net-pci,netdev=n0,mac=" + g.MAC,
		"-virtfs", "local,path=" + g.Share + ",mount_tag=lab,security_model=none",
		"-display", "none", "-monitor", "none",
		"-serial", "file:" + filepath.Join(g.Share, "console.log"),
	}
	log, err := os.Create(filepath.Join(g.Share, "qemu.log"))
	if err != nil {
		return err
	}
	g.cmd = exec.Command("ip", args...)
	g.cmd.Stdout, g.cmd.Stderr = log, log
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// qemu writes its log through its own descriptor: closing ours loses
	// nothing.
	if err := g.cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("guest %s: %w", g.Name, err)
	}
	g.done = make(chan struct{})
	go func() {
		g.err = g.cmd.Wait()
		_ = log.Close()
		close(g.done)
	}()
	g.next = 1
	booted := filepath.Join(g.Share, "booted")
	if err := g.waitFile(booted, timeout); err != nil {
		return fmt.Errorf("guest %s did not boot: %w (see %s)", g.Name, err, filepath.Join(g.Share, "console.log"))
	}
	info, err := os.ReadFile(filepath.Join(g.Share, "info"))
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(info), "\n") {
		k, v, _ := strings.Cut(l, " ")
		switch k {
		case "gid4":
			g.GID4 = v
		case "gid6":
			g.GID6 = v
		case "kernel":
			g.Kernel = v
		}
	}
	if g.GID4 == "" || g.GID6 == "" {
		return fmt.Errorf("guest %s: no IPv4/IPv6 GID in its info file", g.Name)
	}
	return nil
}

// Alive reports whether qemu is still running.
func (g *Guest) Alive() bool {
	if g.done == nil {
		return false
	}
	select {
	case <-g.done:
		return false
	default:
		return true
	}
}

// waitFile polls for a file the guest writes; it gives up early when qemu
// exits. 9p writes land on the host file system directly, so polling the
// directory is enough.
func (g *Guest) waitFile(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if !g.Alive() {
			return fmt.Errorf("qemu exited (%w)", g.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", timeout, filepath.Base(path))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A GuestJob is one command submitted to a guest.
type GuestJob struct {
	g     *Guest
	dir   string
	limit time.Duration
}

// Submit hands the guest its next job: env (shell assignments the guest's
// loop sources), then cmd, then "go", in that order so the guest never sees
// a half-written job.
func (g *Guest) Submit(c *Case, cmd string, ready string) (*GuestJob, error) {
	dir := filepath.Join(g.Share, "job", strconv.Itoa(g.next))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	pct := func(p int) string {
		if p == 0 {
			return ""
		}
		return strconv.Itoa(p)
	}
	env := fmt.Sprintf("MTU=%d\nTIMEOUT=%d\nIPV=%d\nLOSS=%s\nCORRUPT=%s\nREADY=%s\n",
		c.NetdevMTU(), int(c.Timeout/time.Second), c.IP, pct(c.Loss), pct(c.Corrupt), ready)
	if err := os.WriteFile(filepath.Join(dir, "env"), []byte(env), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "cmd"), []byte("# "+c.Name+"\n"+cmd+"\n"), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		return nil, err
	}
	g.next++
	// The guest adds netem, counters and dmesg around the command: allow
	// for that and for TCG's slowness on top of the command's own limit.
	return &GuestJob{g: g, dir: dir, limit: c.Timeout + 20*time.Second}, nil
}

// WaitReady waits until the guest says the job's server is listening (or
// the job already ended, which Wait then reports).
func (j *GuestJob) WaitReady() error {
	deadline := time.Now().Add(j.limit)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(filepath.Join(j.dir, "ready")); err == nil {
			return nil
		}
		if _, err := os.Stat(filepath.Join(j.dir, "rc")); err == nil {
			return nil
		}
		if !j.g.Alive() {
			return fmt.Errorf("guest %s died", j.g.Name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("guest %s: server not ready after %v", j.g.Name, j.limit)
}

// Wait returns the job's exit status once the guest has written it.
func (j *GuestJob) Wait() (int, error) {
	rcPath := filepath.Join(j.dir, "rc")
	deadline := time.Now().Add(j.limit)
	for {
		b, err := os.ReadFile(rcPath)
		// The guest writes "N\n" in one write; wait for the newline.
		if err == nil && strings.HasSuffix(string(b), "\n") {
			return strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if !j.g.Alive() {
			return -1, fmt.Errorf("guest %s died", j.g.Name)
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("guest %s: no exit status after %v", j.g.Name, j.limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Output is the command's combined stdout and stderr.
func (j *GuestJob) Output() string {
	b, _ := os.ReadFile(filepath.Join(j.dir, "out"))
	return string(b)
}

// Counters returns the rxe counter deltas over the job and the kernel log
// the job produced.
func (j *GuestJob) Counters() (Counters, string, error) {
	read := func(name string) (Counters, error) {
		f, err := os.Open(filepath.Join(j.dir, name))
		if err != nil {
			return nil, err
		}
		defer func() { _ = f.Close() }() // read only
		return ParseCounters(bufio.NewReader(f))
	}
	c0, err := read("ctr0")
	if err != nil {
		return nil, "", err
	}
	c1, err := read("ctr1")
	if err != nil {
		return nil, "", err
	}
	if len(c1) == 0 {
		return nil, "", errors.New("no rxe counters")
	}
	dm, _ := os.ReadFile(filepath.Join(j.dir, "dmesg"))
	return Delta(c0, c1), string(dm), nil
}

// Shutdown asks the guest to power off and kills qemu if it does not.
func (g *Guest) Shutdown(timeout time.Duration) {
	if g.cmd == nil || g.done == nil {
		return
	}
	// Failing to ask is as good as a guest that does not answer: killed.
	_ = os.WriteFile(filepath.Join(g.Share, "quit"), nil, 0o644)
	select {
	case <-g.done:
		return
	case <-time.After(timeout):
	}
	_ = syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL) // the group may have exited: g.done says
	<-g.done
}

// kvmUsable reports whether KVM can be used: /dev/kvm opens and the CPU
// flags name vmx or svm.
func kvmUsable() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	_ = f.Close() // opened only to see that it opens
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "flags") {
			for _, fl := range strings.Fields(l) {
				if fl == "vmx" || fl == "svm" {
					return true
				}
			}
			return false
		}
	}
	return false
}
