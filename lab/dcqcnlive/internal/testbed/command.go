package testbed

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// CommandEndpoints runs each flow as two processes started from
// command-line templates: a server in the receiver's namespace, then a
// client in the sender's. It is how softrnic's engine plugs into the
// experiment without the testbed importing it: SoftrnicServer and
// SoftrnicClient are the templates for `softrnic perf write_bw`.
//
// With SharedServer, one server process serves every flow: it is started
// with the first flow (with {clients} = Clients) and each flow's client
// connects to it on the same port. That is how softrnic must run: one
// process per interface owns its AF_XDP queue, so a second server in r
// would never see its flow's packets (the second flow died with
// retry-exceeded). Each flow's receive-side counters are then the ones the
// server reports for that client's QPs (its JSON objects' "dcqcn" whose
// "peer" is the flow's sender), its send-side ones the client's.
//
// Placeholders, replaced in every word: {dev} (the host's interface),
// {addr} (its IPv4 address), {server} (the receiver's address), {port} (the
// side-channel TCP port, BasePort + flow ID), {secs} (how long the flow
// sends, whole seconds), {tclass} (the IPv4 TOS byte, ECT(0) included),
// {dscp}, {cc} (ALGORITHM:PROFILE), {profile}, {scale}, {payload}, {id},
// {clients}.
//
// Counters: when a process exits, every JSON object in its standard output
// is searched (at any depth) for the mlx5 counter names
// np_ecn_marked_roce_packets, np_cnp_sent, rp_cnp_handled, rp_cnp_ignored,
// and the values are summed over client and server.
type CommandEndpoints struct {
	Label          string
	CC             bool     // the processes run congestion control
	Server, Client []string // templates
	BasePort       int      // 0: 18515 (perftest's)
	Bin            string   // replaces a leading "softrnic" word (the binary to run)
	// SharedServer runs one server for all flows, started with the first
	// one; Clients is how many flows will connect to it ({clients}).
	SharedServer bool
	Clients      int
	// LogDir, when set, receives each process's standard output when it
	// ends (server.out or server-N.out, client-N.out): the endpoints' own
	// reports, e.g. softrnic's final QP rates.
	LogDir string

	mu     sync.Mutex
	flows  []*cmdFlow
	shared *sharedServer
}

// sharedServer is the one server process of SharedServer.
type sharedServer struct {
	proc *proc
	port int
	once sync.Once
}

// wait waits for the server (once; later calls return nil, so that its
// failure is reported once).
func (s *sharedServer) wait(d time.Duration) error {
	var err error
	s.once.Do(func() { err = s.proc.wait(d) })
	return err
}

// SoftrnicServer and SoftrnicClient are the command lines the engine is
// expected to accept: perftest's write_bw with congestion control switched
// on by --cc ALGORITHM:PROFILE, dilated by --cc-scale S (rates ÷ S, delays
// and periods × S; see DilateRP), data sent with the given traffic class,
// and --json output carrying the counters (the mlx5 names, and the cc
// object).
var (
	softrnicPerf = []string{"softrnic", "perf", "write_bw", "-d", "{dev}", "-p", "{port}", "-D", "{secs}",
		"-s", "65536", "-m", "{payload}", "-u", "18", "--tclass", "{tclass}", "--cc", "{cc}", "--cc-scale", "{scale}", "--json"}
	// -u 18: a local ACK timeout of 1.07 s instead of perftest's 67 ms.
	// Dilation stretches every delay by S: a 64 KiB WRITE at a rate cut
	// to 7.8 Mb/s takes 67 ms, and a full tbf queue (800 kB) takes 64 ms
	// at 100 Mb/s, so with 67 ms the QPs timed out spuriously and ended
	// with retry-exceeded. 1.07 s covers a message down to 0.5 Mb/s.
	//
	// SoftrnicServer serves every flow's client on r's one device
	// (SharedServer).
	SoftrnicServer = append(append([]string(nil), softrnicPerf...), "--clients", "{clients}")
	SoftrnicClient = append(append([]string(nil), softrnicPerf...), "{server}")
)

// Name implements Endpoints.
func (c *CommandEndpoints) Name() string { return c.Label }

// CongestionControlled implements Endpoints.
func (c *CommandEndpoints) CongestionControlled() bool { return c.CC }

// expand replaces the placeholders in every word of tmpl.
func expand(tmpl []string, bin string, h *Host, spec FlowSpec, port, clients int) []string {
	secs := int((spec.Duration + time.Second - 1) / time.Second)
	r := strings.NewReplacer(
		"{dev}", h.Link.Name, "{addr}", h.Link.Addr.String(), "{server}", spec.Dst.Link.Addr.String(),
		"{port}", strconv.Itoa(port), "{secs}", strconv.Itoa(max(secs, 1)),
		"{tclass}", strconv.Itoa(int(spec.TClass)), "{dscp}", strconv.Itoa(int(spec.TClass>>2)),
		"{cc}", spec.CC, "{profile}", spec.Profile, "{scale}", strconv.FormatFloat(spec.Scale, 'g', -1, 64),
		"{payload}", strconv.Itoa(spec.PayloadBytes), "{id}", strconv.Itoa(spec.ID),
		"{clients}", strconv.Itoa(max(clients, 1)),
	)
	out := make([]string, len(tmpl))
	for i, w := range tmpl {
		out[i] = r.Replace(w)
	}
	if bin != "" && len(out) > 0 && out[0] == "softrnic" {
		out[0] = bin
	}
	return out
}

// StartFlow implements Endpoints: the server first, then, once it listens
// on its side-channel port, the client.
func (c *CommandEndpoints) StartFlow(t *Topology, spec FlowSpec) (Flow, error) {
	if len(c.Server) == 0 || len(c.Client) == 0 {
		return nil, errors.New("testbed: command endpoints need a server and a client command")
	}
	port := c.BasePort
	if port == 0 {
		port = 18515
	}
	f := &cmdFlow{deadline: time.Now().Add(spec.Duration), peer: spec.Src.Link.Addr.String(), id: spec.ID, logDir: c.LogDir}
	if c.SharedServer {
		c.mu.Lock()
		sh := c.shared
		c.mu.Unlock()
		if sh == nil {
			// The server runs for the whole experiment: the first flow's
			// duration covers every later flow's.
			sh = &sharedServer{port: port + 1}
			var err error
			if sh.proc, err = startProc(spec.Dst, expand(c.Server, c.Bin, spec.Dst, spec, sh.port, c.Clients)); err != nil {
				return nil, err
			}
			if err := waitListen(spec.Dst, sh.port, 10*time.Second, sh.proc); err != nil {
				sh.proc.kill()
				return nil, err
			}
			c.mu.Lock()
			c.shared = sh
			c.mu.Unlock()
		}
		f.shared = sh
		var err error
		if f.client, err = startProc(spec.Src, expand(c.Client, c.Bin, spec.Src, spec, sh.port, c.Clients)); err != nil {
			return nil, err
		}
	} else {
		port += spec.ID
		var err error
		if f.server, err = startProc(spec.Dst, expand(c.Server, c.Bin, spec.Dst, spec, port, 1)); err != nil {
			return nil, err
		}
		if err := waitListen(spec.Dst, port, 10*time.Second, f.server); err != nil {
			f.server.kill()
			return nil, err
		}
		if f.client, err = startProc(spec.Src, expand(c.Client, c.Bin, spec.Src, spec, port, 1)); err != nil {
			f.server.kill()
			return nil, err
		}
	}
	c.mu.Lock()
	c.flows = append(c.flows, f)
	c.mu.Unlock()
	return f, nil
}

// Close implements Endpoints.
func (c *CommandEndpoints) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, f := range c.flows {
		errs = append(errs, f.Stop())
	}
	if c.shared != nil {
		// A server whose clients never all came is ended here.
		errs = append(errs, c.shared.wait(0))
	}
	return errors.Join(errs...)
}

// proc is one process in a namespace.
type proc struct {
	argv []string
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
	err  error
}

func startProc(h *Host, argv []string) (*proc, error) {
	p := &proc{argv: argv, done: make(chan struct{})}
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", h.NS.Name}, argv...)...)
	p.cmd.Stdout = &p.out
	p.cmd.Stderr = os.Stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // killed as a group
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("testbed: start %s in %s: %w", strings.Join(argv, " "), h.Name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

// wait waits for the process until d has passed, then interrupts it, then
// kills it; it reports a failure exit.
func (p *proc) wait(d time.Duration) error {
	select {
	case <-p.done:
	case <-time.After(d):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT) // the group may have exited: p.done says
		select {
		case <-p.done:
		case <-time.After(3 * time.Second):
			p.kill()
		}
	}
	if p.err != nil {
		return fmt.Errorf("testbed: %s: %w", strings.Join(p.argv, " "), p.err)
	}
	return nil
}

func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // the group may have exited: p.done says
	<-p.done
}

// waitListen waits (bounded) until a TCP socket listens on port in h's
// namespace, reading /proc/thread-self/net/tcp{,6} from a thread inside it
// (connecting would use up the server's one connection).
func waitListen(h *Host, port int, limit time.Duration, p *proc) error {
	want := fmt.Sprintf(":%04X ", port)
	end := time.Now().Add(limit)
	for time.Now().Before(end) {
		select {
		case <-p.done:
			return fmt.Errorf("testbed: %s exited before listening: %w", strings.Join(p.argv, " "), p.err)
		default:
		}
		found := false
		err := h.NS.Do(func() error {
			for _, f := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
				b, err := os.ReadFile(f)
				if err != nil {
					continue
				}
				for _, l := range strings.Split(string(b), "\n") {
					fs := strings.Fields(l)
					// local_address rem_address st: 0A is LISTEN.
					if len(fs) > 3 && strings.HasSuffix(fs[1]+" ", want) && fs[3] == "0A" {
						found = true
					}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if found {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("testbed: nothing listens on port %d in %s after %v", port, h.Name, limit)
}

// cmdFlow is a running server/client pair (server nil: the shared one).
type cmdFlow struct {
	server, client *proc
	shared         *sharedServer
	peer           string // the sender's address, as the shared server's JSON names it
	id             int
	logDir         string
	deadline       time.Time
	once           sync.Once
	counters       EndpointCounters
}

// Stop implements Flow: it waits for both processes until their run time
// has passed (plus a grace of 10 s), then ends them. Only the first call
// reports their failure.
func (f *cmdFlow) Stop() error {
	var err error
	f.once.Do(func() {
		grace := time.Until(f.deadline) + 10*time.Second
		if f.shared != nil {
			err = f.client.wait(grace)
			// The server ends once every client is done (its last one
			// shortly after this one): wait for it, not end it.
			err = errors.Join(err, f.shared.wait(grace))
			addCounters(&f.counters, f.client.out.Bytes())
			addSenderRate(&f.counters, f.client.out.Bytes())
			addPeerCounters(&f.counters, f.shared.proc.out.Bytes(), f.peer)
			f.save("server.out", f.shared.proc)
			f.save(fmt.Sprintf("client-%d.out", f.id), f.client)
			return
		}
		err = errors.Join(f.client.wait(grace), f.server.wait(grace))
		f.save(fmt.Sprintf("server-%d.out", f.id), f.server)
		f.save(fmt.Sprintf("client-%d.out", f.id), f.client)
		for _, p := range []*proc{f.client, f.server} {
			addCounters(&f.counters, p.out.Bytes())
		}
		addSenderRate(&f.counters, f.client.out.Bytes())
	})
	return err
}

// save writes p's output to name in the log directory, if there is one
// (best effort: the log is for reading, the counters are already taken).
func (f *cmdFlow) save(name string, p *proc) {
	if f.logDir == "" {
		return
	}
	if os.MkdirAll(f.logDir, 0o755) == nil {
		_ = os.WriteFile(f.logDir+"/"+name, p.out.Bytes(), 0o644)
	}
}

// Counters implements Flow (after Stop).
func (f *cmdFlow) Counters() EndpointCounters { return f.counters }

// addCounters adds the mlx5-named counters found in the JSON objects of out.
func addCounters(c *EndpointCounters, out []byte) { eachJSON(out, func(v any) { walkCounters(c, v) }) }

// addSenderRate takes, from a client's output (only the sender's: a
// server's QPs carry rates too), what its congestion control allowed at
// the end, summed over its QPs (perf's cc.qps[]: the rate, capped for a
// window algorithm by the window over the smoothed RTT), their counts and
// last figures, and DCQCN's largest α (dcqcn.qps[].alpha). An output
// without a cc object (an older perf) gives dcqcn.qps[].rate_mbps.
func addSenderRate(c *EndpointCounters, out []byte) {
	eachJSON(out, func(v any) {
		top, _ := v.(map[string]any)
		num := func(m map[string]any, k string) float64 {
			n, _ := m[k].(float64)
			return max(n, 0)
		}
		qps := func(key string) []map[string]any {
			o, _ := top[key].(map[string]any)
			l, _ := o["qps"].([]any)
			var r []map[string]any
			for _, q := range l {
				if m, ok := q.(map[string]any); ok {
					r = append(r, m)
				}
			}
			return r
		}
		for _, q := range qps("dcqcn") {
			c.RPAlpha = max(c.RPAlpha, num(q, "alpha"))
			if _, ok := top["cc"]; !ok {
				c.RPRateMbps += num(q, "rate_mbps")
			}
		}
		for _, q := range qps("cc") {
			rate := num(q, "rate_mbps")
			if w, srtt := num(q, "window_bytes"), num(q, "srtt_us"); w > 0 && srtt > 0 {
				rate = min(rate, w*8/srtt) // bytes per µs × 8 = Mb/s
			}
			c.RPRateMbps += rate
			c.CCRTTSamples += uint64(num(q, "rtt_samples"))
			c.CCDecreases += uint64(num(q, "decreases"))
			c.CCLossEvents += uint64(num(q, "loss_events"))
			c.CCWindowFull += uint64(num(q, "window_full"))
			c.Cwnd += num(q, "cwnd")
			c.SRTTUs = max(c.SRTTUs, num(q, "srtt_us"))
			c.MinRTTUs = max(c.MinRTTUs, num(q, "min_rtt_us"))
			c.HostDelayUs = max(c.HostDelayUs, num(q, "host_delay_us"))
			c.TargetUs = max(c.TargetUs, num(q, "target_us"))
		}
	})
}

// eachJSON calls fn with every JSON object found in out, skipping text
// between them.
func eachJSON(out []byte, fn func(v any)) {
	for i := bytes.IndexByte(out, '{'); i >= 0 && i < len(out); {
		dec := json.NewDecoder(bytes.NewReader(out[i:]))
		var v any
		if err := dec.Decode(&v); err != nil {
			// Not JSON here: try the next brace.
			j := bytes.IndexByte(out[i+1:], '{')
			if j < 0 {
				return
			}
			i += 1 + j
			continue
		}
		fn(v)
		i += int(dec.InputOffset())
		j := bytes.IndexByte(out[i:], '{')
		if j < 0 {
			return
		}
		i += j
	}
}

// addPeerCounters adds, from a shared server's output, the per-QP counts
// of the JSON objects whose dcqcn.peer is peer (the device-wide mlx5
// counters there cover every flow, so they are not used; the other
// algorithms have no receive-side counts).
func addPeerCounters(c *EndpointCounters, out []byte, peer string) {
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var v struct {
			DCQCN *struct {
				Peer string `json:"peer"`
				QPs  []struct {
					ECNMarked  uint64 `json:"ecn_marked"`
					CNPSent    uint64 `json:"cnp_sent"`
					CNPHandled uint64 `json:"cnp_handled"`
					CNPIgnored uint64 `json:"cnp_ignored"`
				} `json:"qps"`
			} `json:"dcqcn"`
		}
		if err := dec.Decode(&v); err != nil {
			return // the end, or text that is not one of these objects
		}
		if v.DCQCN == nil || v.DCQCN.Peer != peer {
			continue
		}
		for _, q := range v.DCQCN.QPs {
			c.RecvCE += q.ECNMarked
			c.CNPSent += q.CNPSent
			c.CNPHandled += q.CNPHandled
			c.CNPIgnored += q.CNPIgnored
		}
	}
}

func walkCounters(c *EndpointCounters, v any) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			n, isNum := e.(float64)
			if !isNum || n < 0 {
				walkCounters(c, e)
				continue
			}
			switch k {
			case "np_ecn_marked_roce_packets":
				c.RecvCE += uint64(n)
			case "np_cnp_sent":
				c.CNPSent += uint64(n)
			case "rp_cnp_handled":
				c.CNPHandled += uint64(n)
			case "rp_cnp_ignored":
				c.CNPIgnored += uint64(n)
			}
		}
	case []any:
		for _, e := range x {
			walkCounters(c, e)
		}
	}
}
