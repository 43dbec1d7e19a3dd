package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/verbs"
)

// allAttacks in the order they run.
var allAttacks = []string{"silent", "cqs", "maps", "mrs", "qps", "bigcqs", "qkey", "badwr"}

func main() {
	if role := os.Getenv("SOFTRNIC_HOSTILE_ROLE"); role != "" {
		os.Exit(attacker(role, os.Getenv("SOFTRNIC_CONTROL"), os.Args[1:]))
	}
	bin := flag.String("softrnic", "bin/softrnic", "the softrnic binary whose daemon is attacked")
	attacks := flag.String("attacks", strings.Join(allAttacks, ","), "attacks to run, comma separated")
	stream := flag.Duration("stream", 20*time.Second, "length of the well-behaved stream beside each attack")
	jsonPath := flag.String("json", "", "write the results as JSON here too")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/hostile: needs root (namespaces, XDP, a client of another user)")
		os.Exit(2)
	}
	abs, err := filepath.Abs(*bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	dir, err := os.MkdirTemp("", "softrnic-hostile-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := os.Chmod(dir, 0o755); err != nil { // the attackers of another user run from it
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	self, err := copySelf(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	start := time.Now()
	fmt.Printf("bench/hostile: %s, %s, load %s\n", abs, start.Format(time.RFC3339), loadavg())
	var results []*Result
	for _, a := range strings.Split(*attacks, ",") {
		r := run(a, abs, self, dir, *stream)
		results = append(results, r)
		r.print(os.Stdout)
	}
	fmt.Printf("done in %v, load %s\n", time.Since(start).Round(time.Second), loadavg())
	if *jsonPath != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.MkdirAll(filepath.Dir(*jsonPath), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := os.WriteFile(*jsonPath, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

// Result is one attack's outcome.
type Result struct {
	Attack string
	// Figures of the daemon process.
	Before, Peak, After Figures
	DaemonDied          bool   // the daemon exited during the attack
	DaemonLog           string `json:",omitempty"` // its last lines, if it died
	// Served: a new client, during the attack, made a PD, an MR, a CQ
	// and a QP (or the error it got).
	Served string
	// Stream: the well-behaved write_bw through the daemon (MiB/s, or
	// why it failed).
	Stream string
	// Attacker is what the attacking processes reported.
	Attacker []string
	Load     string
}

// Figures are what a process holds.
type Figures struct {
	FDs, Maps   int
	RSS, VMSize int64 // bytes
}

func (f Figures) String() string {
	if f.FDs == 0 && f.Maps == 0 {
		return "-"
	}
	return fmt.Sprintf("%d fds, %d maps, RSS %d MiB, VM %d MiB", f.FDs, f.Maps, f.RSS>>20, f.VMSize>>20)
}

func figuresOf(pid int) Figures {
	var f Figures
	d := "/proc/" + strconv.Itoa(pid)
	if e, err := os.ReadDir(d + "/fd"); err == nil {
		f.FDs = len(e)
	}
	if b, err := os.ReadFile(d + "/maps"); err == nil {
		f.Maps = bytes.Count(b, []byte{'\n'})
	}
	if b, err := os.ReadFile(d + "/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			switch k {
			case "VmRSS":
				f.RSS = kb << 10
			case "VmSize":
				f.VMSize = kb << 10
			}
		}
	}
	return f
}

func (r *Result) print(w io.Writer) {
	fmt.Fprintf(w, "\n== %s (load %s)\n", r.Attack, r.Load)
	fmt.Fprintf(w, "daemon before: %v\n", r.Before)
	fmt.Fprintf(w, "daemon during: %v\n", r.Peak)
	fmt.Fprintf(w, "daemon after:  %v\n", r.After)
	if r.DaemonDied {
		fmt.Fprintf(w, "DAEMON DIED:\n%s\n", r.DaemonLog)
	}
	fmt.Fprintf(w, "new client during the attack: %s\n", r.Served)
	fmt.Fprintf(w, "stream through the daemon: %s\n", r.Stream)
	for _, l := range r.Attacker {
		fmt.Fprintf(w, "attacker: %s\n", l)
	}
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// copySelf puts this program where another user can run it.
func copySelf(dir string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "hostile")
	return p, os.WriteFile(p, b, 0o755)
}

// attackPlan is how an attack is run: its processes (role, args, as
// nobody or not).
type proc struct {
	role   string
	args   []string
	nobody bool
}

func plan(attack string) []proc {
	switch attack {
	case "silent":
		return []proc{{role: "silent", args: []string{"12000"}, nobody: true}, {role: "silent", args: []string{"12000"}, nobody: true}}
	case "cqs":
		return []proc{{role: "cqs", args: []string{"3", "4095", "1"}, nobody: true}}
	case "maps":
		return []proc{{role: "maps", args: []string{"16", "4090", "700"}, nobody: true}}
	case "mrs":
		return []proc{{role: "mrs", args: []string{"100000"}, nobody: true}}
	case "qps":
		return []proc{{role: "qps", args: []string{"20"}, nobody: true}}
	case "bigcqs":
		return []proc{{role: "cqs", args: []string{"1", "20", strconv.Itoa(1 << 20)}, nobody: true}}
	case "qkey":
		return []proc{{role: "qkey", nobody: true}}
	case "badwr":
		return []proc{{role: "badwr", nobody: true}}
	}
	return nil
}

// run runs one attack against a fresh daemon.
func run(attack, bin, self, dir string, stream time.Duration) *Result {
	r := &Result{Attack: attack, Load: loadavg()}
	procs := plan(attack)
	if procs == nil {
		r.Served = "unknown attack"
		return r
	}
	pair, err := netnstest.NewPair(netnstest.PairOptions{})
	if err != nil {
		r.Served = "no namespaces: " + err.Error()
		return r
	}
	defer func() { _ = pair.Close() }()
	sock := filepath.Join(dir, attack+".sock")
	var logs bytes.Buffer
	d := exec.Command("ip", "netns", "exec", pair.A.NS.Name, bin, "daemon", "-d", pair.A.Name, "--control", sock,
		"--port", "afxdp", "--control-group", "65534", "--log-level", "warn")
	d.Stdout, d.Stderr = &logs, &logs
	if err := d.Start(); err != nil {
		r.Served = err.Error()
		return r
	}
	died := make(chan error, 1)
	go func() { died <- d.Wait() }()
	defer func() {
		_ = d.Process.Signal(syscall.SIGTERM) // gone already if it died
		kill := time.AfterFunc(15*time.Second, func() { _ = d.Process.Kill() })
		if err := <-died; err != nil && !r.DaemonDied {
			fmt.Fprintf(os.Stderr, "bench/hostile: %s: the daemon's exit after SIGTERM: %v\n", attack, err)
		}
		kill.Stop()
	}()
	// ip netns exec execs the daemon: the command's pid is the daemon's.
	pid := d.Process.Pid
	var c *client.Client
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err = client.Dial(sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			r.Served = "daemon never answered: " + err.Error()
			return r
		}
	}
	// The well-behaved stream: its receiver's QPs in the daemon. A local
	// ACK timeout of 1 s (-u 18), so that a loaded machine's scheduling
	// does not end it: what ends it is the daemon.
	ctx, cancel := context.WithTimeout(context.Background(), stream+time.Minute)
	defer cancel()
	secs := strconv.Itoa(int(stream / time.Second))
	srv := exec.CommandContext(ctx, "ip", "netns", "exec", pair.A.NS.Name, bin, "perf", "write_bw", "--daemon", sock, "-D", secs, "-p", "18777", "-u", "18", "--json")
	var sout, serr bytes.Buffer
	srv.Stdout, srv.Stderr = &sout, &serr
	_ = srv.Start() // an error comes back from Wait
	cli := exec.CommandContext(ctx, "ip", "netns", "exec", pair.B.NS.Name, bin, "perf", "write_bw", "-d", pair.B.Name, "-D", secs, "-p", "18777", "-u", "18", "--json", pair.A.Addr.String())
	cli.Env = append(os.Environ(), "SOFTRNIC_PORT=afpacket")
	var cout, cerr bytes.Buffer
	cli.Stdout, cli.Stderr = &cout, &cerr
	time.Sleep(500 * time.Millisecond) // the server listens
	_ = cli.Start()                    // an error comes back from Wait
	time.Sleep(2 * time.Second)        // the stream runs
	r.Before = figuresOf(pid)

	// The attack: its processes hold what they took until told to go.
	var kids []*exec.Cmd
	var stdins []io.WriteCloser
	var outs []*bufio.Reader
	for _, p := range procs {
		k := exec.Command(self, p.args...)
		k.Env = append(os.Environ(), "SOFTRNIC_HOSTILE_ROLE="+p.role, "SOFTRNIC_CONTROL="+sock, "SOFTRNIC_PEER="+pair.B.Addr.String())
		if p.nobody {
			k.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
		}
		in, _ := k.StdinPipe()
		out, _ := k.StdoutPipe()
		k.Stderr = os.Stderr
		if err := k.Start(); err != nil {
			r.Attacker = append(r.Attacker, "not started: "+err.Error())
			continue
		}
		kids, stdins, outs = append(kids, k), append(stdins, in), append(outs, bufio.NewReader(out))
	}
	// Each attacker reports, then says "holding".
	for _, o := range outs {
		for {
			l, err := o.ReadString('\n')
			l = strings.TrimSpace(l)
			if err != nil || l == "holding" {
				break
			}
			r.Attacker = append(r.Attacker, l)
		}
	}
	r.Peak = figuresOf(pid)
	r.Served = probe(sock)
	for _, in := range stdins {
		_ = in.Close() // the attacker's signal to go
	}
	for _, k := range kids {
		_ = k.Wait() // what it did is in its report
	}
	time.Sleep(3 * time.Second) // the daemon releases what the attackers held
	r.After = figuresOf(pid)
	// A daemon whose figures are gone is exiting: wait for it a little,
	// so that it is reported as dead, not as holding nothing.
	var derr error
	dead := false
	if r.After.FDs == 0 && r.After.Maps == 0 {
		select {
		case derr = <-died:
			dead = true
		case <-time.After(5 * time.Second):
		}
	} else {
		select {
		case derr = <-died:
			dead = true
		default:
		}
	}
	if dead {
		died <- derr
		r.DaemonDied = true
		r.DaemonLog = lastLines(logs.String(), 4)
	}
	cerrW := cli.Wait()
	_ = srv.Wait() // the client side reports the stream's rate
	r.Stream = streamResult(cout.Bytes(), cerrW, cerr.String()+serr.String())
	return r
}

// probe is a new, well-behaved client: a PD, an MR, a CQ and a QP.
func probe(sock string) string {
	c, err := client.Dial(sock)
	if err != nil {
		return "refused: " + err.Error()
	}
	defer c.Close()
	pd, err := c.AllocPD()
	if err != nil {
		return "ALLOC_PD: " + err.Error()
	}
	mem, err := client.AllocMem(1 << 16)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = mem.Free() }()
	if _, err := pd.RegMR(mem, 0, 1<<16, 0, ib.LocalWrite); err != nil {
		return "REG_MR: " + err.Error()
	}
	cq, err := c.CreateCQ(64)
	if err != nil {
		return "CREATE_CQ: " + err.Error()
	}
	if _, err := pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: ib.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return "CREATE_QP: " + err.Error()
	}
	return "served"
}

func streamResult(out []byte, err error, stderr string) string {
	var res struct {
		BW []struct {
			BWAverage float64 `json:"BW_average"`
		} `json:"results_bw"`
	}
	if err != nil {
		return fmt.Sprintf("FAILED (%v): %s", err, lastLines(stderr, 2))
	}
	if i := bytes.IndexByte(out, '{'); i >= 0 {
		out = out[i:]
	}
	if json.Unmarshal(out, &res) != nil || len(res.BW) == 0 {
		return "no result: " + lastLines(string(out)+stderr, 2)
	}
	return fmt.Sprintf("%.1f MiB/s", res.BW[0].BWAverage)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
