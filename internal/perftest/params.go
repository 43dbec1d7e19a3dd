package perftest

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/ib"
)

// Params are the command-line parameters of one perftest-style run.
type Params struct {
	Test
	Host        string        // server to connect to; "" runs the server
	Device      string        // -d: the network interface carrying RoCE
	Port        int           // -p: TCP port of the side channel
	Iters       uint64        // -n
	MTU         MTU           // -m (0: the interface's)
	GIDIndex    int           // -x (-1: the first IPv4 address's GID)
	Duration    time.Duration // -D (0: iteration count)
	TxDepth     int           // -t
	RxDepth     int           // -r
	CQMod       int           // -Q
	OutReads    int           // -o
	InlineSize  int           // -I
	TClass      int           // --tclass
	HopLimit    int           // --hop_limit
	QPTimeout   uint8         // -u: local ACK timeout exponent, 4.096 µs · 2^u (default 14 ≈ 67 ms)
	ReportGbits bool          // --report_gbits
	JSON        bool          // --json: results as JSON on stdout
	Verify      bool          // --verify: check every byte received
	// CC is --cc: the device's congestion control, ALGORITHM[:PROFILE]
	// (off, dcqcn, swift, timely; host.ParseCC), "" when not given.
	CC string
	// DCQCN is --dcqcn: DCQCN's profile, "off", "paper", "connectx" or
	// "hpcc-mlx", "" when not given. Alone it means --cc dcqcn:PROFILE
	// (--dcqcn off: off); beside --cc it names --cc dcqcn's profile.
	DCQCN string
	// CCScale is --cc-scale (also --dcqcn-scale): the time dilation of
	// the congestion-control parameters (rates ÷ S, delays and periods ×
	// S), at least 1 (default 1), so that a testbed with a slow bottleneck
	// keeps the dynamics of a fast one.
	CCScale float64
	// HostCC is --host-cc: when DCQCN's notification point signals host
	// congestion (dcqcn.ParseHostCC: on, off or fill=F,rx=R,hold=D), ""
	// when not given (on, the defaults).
	HostCC string
	// Clients is --clients: how many clients a server serves at once on
	// its one device (default 1). Several flows into one interface must
	// share one device, since only one process can own its AF_XDP queue.
	Clients int
	// RDMACM is -R/--rdma_cm: perftest's control channel and the test's
	// QPs connected through rdma_cm (the IB CM on QP1) instead of TCP.
	RDMACM bool
	// Recovery is --recovery: the loss recovery of the test's RC QPs
	// (selective, adaptive or timeout; default: the device's, selective
	// repeat with adaptive retransmission unless the daemon says
	// otherwise).
	Recovery ib.Recovery
}

// Perftest's defaults (perftest_parameters.h).
const (
	defSizeBW    = 65536
	defSizeLat   = 2
	defIters     = 1000
	defItersWB   = 5000
	defTxBW      = 128
	defTxLat     = 1
	defRxSend    = 512
	defCQMod     = 100
	defHopLimit  = 64
	defQPTimeout = 14      // DEF_QP_TIME
	maxMsgSize   = 1 << 23 // MAX_SIZE
	defAtomicOut = 16      // our responder's atomic/READ resources
)

// option describes one flag: its short and long names and whether it
// takes a value.
type option struct {
	short byte
	long  string
	arg   bool
}

var options = []option{
	{'d', "ib-dev", true}, {'s', "size", true}, {'n', "iters", true}, {'q', "qp", true},
	{'m', "mtu", true}, {'p', "port", true}, {'c', "connection", true}, {'x', "gid-index", true},
	{'a', "all", false}, {'D', "duration", true}, {'t', "tx-depth", true}, {'r', "rx-depth", true},
	{'F', "CPU-freq", false}, {'Q', "cq-mod", true}, {'o', "outs", true}, {'I', "inline_size", true},
	{0, "report_gbits", false}, {0, "json", false}, {0, "verify", false},
	{0, "tclass", true}, {0, "hop_limit", true}, {'u', "qp-timeout", true}, {'h', "help", false},
	{0, "dcqcn", true}, {0, "dcqcn-scale", true}, {0, "cc", true}, {0, "cc-scale", true}, {0, "host-cc", true},
	{0, "clients", true},
	{'R', "rdma_cm", false}, {0, "recovery", true},
}

// ErrHelp is returned by ParseArgs for -h/--help.
var ErrHelp = errors.New("perftest: help requested")

// Usage lists the flags ParseArgs understands.
const Usage = `  -d, --ib-dev=IFACE     network interface carrying RoCE
  -s, --size=BYTES       message size (default 65536 for BW, 2 for latency)
  -n, --iters=N          iterations (default 5000 write_bw, 1000 otherwise)
  -q, --qp=N             number of QPs (default 1)
  -m, --mtu=BYTES        path MTU: 256, 512, 1024, 2048 or 4096 (default: the interface's)
  -p, --port=PORT        TCP port of the side channel (default 18515)
  -c, --connection=RC|UC|UD   transport (default RC)
  -x, --gid-index=N      GID index (0: first IPv4 address, IPv4-mapped; then IPv6 addresses)
  -a, --all              run every size from 2 B to 8 MiB
  -D, --duration=SEC     run for SEC seconds instead of -n iterations
  -t, --tx-depth=N       send queue depth (default 128 BW, 1 latency)
  -r, --rx-depth=N       receive queue depth (default 512)
  -Q, --cq-mod=N         signal one completion every N sends (default 100)
  -o, --outs=N           outstanding READ/atomic requests
  -F, --CPU-freq         accepted for perftest compatibility (we measure in ns)
      --tclass=N         traffic class of the QPs
      --hop_limit=N      hop limit / TTL of the QPs (default 64)
  -u, --qp-timeout=N     local ACK timeout 4.096 µs × 2^N (default 14, about 67 ms)
      --report_gbits     report bandwidth in Gb/s instead of MiB/s
      --json             print the results as JSON
      --verify           fill buffers with a pattern and check every byte received
      --cc=ALGO[:PROFILE]   congestion control of the RC/UC QPs: off (default), dcqcn, swift, timely
                         (profiles: dcqcn connectx|paper|hpcc-mlx, swift default, timely artifact|paper)
      --cc-scale=S       time dilation of congestion control: rates ÷ S, delays × S (default 1, >= 1)
      --dcqcn=PROFILE    DCQCN's profile: off, paper, connectx, hpcc-mlx; alone: --cc dcqcn:PROFILE
      --dcqcn-scale=S    the same as --cc-scale
      --host-cc=on|off|fill=F,rx=R,hold=D   DCQCN: CNPs for host congestion, when fewer than
                         F of the receive buffers wait for the network or R wait for the
                         reader, for D after (default fill=0.25,rx=0.5,hold=100us)
      --clients=N        server: serve N clients at once on the one device (default 1)
      --recovery=selective|adaptive|timeout   loss recovery of the RC QPs (default: the
                         device's, selective): selective repeat with a softrnic peer and
                         adaptive retransmission; adaptive retransmission alone (go-back-N);
                         or the local ACK timeout alone, as rxe
  -R, --rdma_cm          connect through rdma_cm (IB CM on QP1), as perftest -R: control channel and test QPs
`

// ParseArgs parses perftest's flags for the test named by verb and measure,
// getopt_long style: "-s 4096", "-s4096", "--size 4096", "--size=4096",
// flags and the server host in any order.
func ParseArgs(verb Verb, measure Measure, args []string) (Params, error) {
	p := Params{Test: Test{Verb: verb, Measure: measure, Transport: RC, QPs: 1}, Port: DefaultPort,
		GIDIndex: -1, RxDepth: defRxSend, CQMod: defCQMod, HopLimit: defHopLimit, TClass: 0, QPTimeout: defQPTimeout,
		CCScale: 1, Clients: 1}
	itersGiven := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			if i+1 < len(args) && p.Host == "" {
				p.Host = args[i+1]
			}
			break
		}
		if len(a) < 2 || a[0] != '-' {
			if p.Host != "" {
				return p, fmt.Errorf("perftest: more than one server given (%q, %q)", p.Host, a)
			}
			p.Host = a
			continue
		}
		var o *option
		var val string
		hasVal := false
		if strings.HasPrefix(a, "--") {
			name := a[2:]
			if k := strings.IndexByte(name, '='); k >= 0 {
				name, val, hasVal = name[:k], name[k+1:], true
			}
			for j := range options {
				if options[j].long == name {
					o = &options[j]
				}
			}
		} else {
			for j := range options {
				if options[j].short != 0 && options[j].short == a[1] {
					o = &options[j]
				}
			}
			if o != nil && len(a) > 2 {
				if !o.arg {
					return p, fmt.Errorf("perftest: flag -%c takes no value (%q)", a[1], a)
				}
				val, hasVal = a[2:], true
			}
		}
		if o == nil {
			return p, fmt.Errorf("perftest: unknown flag %q", a)
		}
		if o.arg && !hasVal {
			if i+1 >= len(args) {
				return p, fmt.Errorf("perftest: flag %q needs a value", a)
			}
			i++
			val = args[i]
		} else if !o.arg && hasVal {
			return p, fmt.Errorf("perftest: flag %q takes no value", a)
		}
		if err := p.set(o, val); err != nil {
			return p, err
		}
		if o.short == 'n' {
			itersGiven = true
		}
	}
	return p, p.finish(itersGiven)
}

func (p *Params) set(o *option, val string) error {
	num := func(lo, hi int64) (int64, error) {
		n, err := strconv.ParseInt(val, 0, 64)
		if err != nil || n < lo || n > hi {
			return 0, fmt.Errorf("perftest: --%s=%q: want an integer in [%d, %d]", o.long, val, lo, hi)
		}
		return n, nil
	}
	var n int64
	var err error
	switch o.long {
	case "ib-dev":
		p.Device = val
	case "size":
		n, err = num(1, maxMsgSize)
		p.Size, p.SizeGiven = uint64(n), true
	case "iters":
		n, err = num(5, 1<<40)
		p.Iters = uint64(n)
	case "qp":
		n, err = num(1, 1024)
		p.QPs = int(n)
	case "mtu":
		n, err = num(256, 4096)
		p.MTU = MTUFromBytes(int(n))
		if err == nil && p.MTU.Bytes() != int(n) {
			err = fmt.Errorf("perftest: --mtu=%s: want 256, 512, 1024, 2048 or 4096", val)
		}
	case "port":
		n, err = num(1, 65535)
		p.Port = int(n)
	case "connection":
		switch strings.ToUpper(val) {
		case "RC":
			p.Transport = RC
		case "UC":
			p.Transport = UC
		case "UD":
			p.Transport = UD
		default:
			err = fmt.Errorf("perftest: --connection=%q: want RC, UC or UD", val)
		}
	case "gid-index":
		n, err = num(0, 255)
		p.GIDIndex = int(n)
	case "all":
		p.AllSizes = true
	case "duration":
		n, err = num(1, 1<<20)
		p.Duration = time.Duration(n) * time.Second
	case "tx-depth":
		n, err = num(1, 1<<15)
		p.TxDepth = int(n)
	case "rx-depth":
		n, err = num(1, 1<<15)
		p.RxDepth = int(n)
	case "cq-mod":
		n, err = num(1, 1<<15)
		p.CQMod = int(n)
	case "outs":
		n, err = num(1, 0xffff)
		p.OutReads = int(n)
	case "inline_size":
		n, err = num(0, 1024)
		p.InlineSize = int(n)
	case "tclass":
		n, err = num(0, 255)
		p.TClass = int(n)
	case "hop_limit":
		n, err = num(0, 255)
		p.HopLimit = int(n)
	case "qp-timeout":
		n, err = num(0, 31)
		p.QPTimeout = uint8(n)
	case "report_gbits":
		p.ReportGbits = true
	case "json":
		p.JSON = true
	case "verify":
		p.Verify = true
	case "dcqcn":
		switch v := strings.ToLower(val); v {
		case "off", "paper", "connectx", "hpcc-mlx":
			p.DCQCN = v
		default:
			err = fmt.Errorf("perftest: --dcqcn=%q: want off, paper, connectx or hpcc-mlx", val)
		}
	case "cc":
		v := strings.ToLower(val)
		algo, profile, _ := strings.Cut(v, ":")
		switch {
		case algo != "off" && algo != "dcqcn" && algo != "swift" && algo != "timely",
			strings.Contains(v, ":") && (profile == "" || algo == "off"):
			err = fmt.Errorf("perftest: --cc=%q: want off, dcqcn, swift or timely, optionally :PROFILE", val)
		default:
			p.CC = v
		}
	case "dcqcn-scale", "cc-scale":
		f, ferr := strconv.ParseFloat(val, 64)
		if ferr != nil || !(f >= 1) || f > 1e9 {
			return fmt.Errorf("perftest: --%s=%q: want a number from 1 to 1e9", o.long, val)
		}
		p.CCScale = f
	case "host-cc":
		if _, herr := dcqcn.ParseHostCC(val); herr != nil {
			return fmt.Errorf("perftest: --host-cc: %w", herr)
		}
		p.HostCC = val
	case "rdma_cm":
		p.RDMACM = true
	case "recovery":
		p.Recovery, err = ib.ParseRecovery(strings.ToLower(val))
	case "clients":
		n, err = num(1, 64)
		p.Clients = int(n)
	case "CPU-freq":
	case "help":
		return ErrHelp
	}
	return err
}

// finish applies perftest's defaults and cross-checks.
func (p *Params) finish(itersGiven bool) error {
	if !p.SizeGiven {
		p.Size = defSizeBW
		if p.Measure == Latency {
			p.Size = defSizeLat
		}
	}
	if p.Verb == Atomic {
		p.Size = 8
	}
	if !itersGiven {
		p.Iters = defIters
		if p.Verb == Write && p.Measure == BW {
			p.Iters = defItersWB
		}
	}
	if p.TxDepth == 0 {
		p.TxDepth = defTxBW
		if p.Measure == Latency {
			p.TxDepth = defTxLat
		}
	}
	if p.OutReads == 0 {
		p.OutReads = 1
		if p.Verb == Read || p.Verb == Atomic {
			p.OutReads = defAtomicOut
		}
	}
	if p.Transport == UD && p.Verb != Send {
		return fmt.Errorf("perftest: UD supports only SEND tests")
	}
	if p.Transport == UC && (p.Verb == Read || p.Verb == Atomic) {
		return fmt.Errorf("perftest: UC does not support %v", p.Verb)
	}
	if p.Duration > 0 && p.AllSizes {
		return fmt.Errorf("perftest: -D and -a cannot be combined")
	}
	if p.RDMACM && ((p.Transport != RC && p.Transport != UD) || p.Clients > 1) {
		return fmt.Errorf("perftest: -R supports RC or UD and one client")
	}
	if p.Clients > 1 && p.Host != "" {
		return fmt.Errorf("perftest: --clients is for the server (no server address)")
	}
	if p.Measure == BW && p.CQMod > p.TxDepth {
		p.CQMod = p.TxDepth // perftest: CQ moderation cannot exceed the TX depth
	}
	if p.Measure == BW && p.TxDepth > int(p.Iters) && p.Duration == 0 {
		p.TxDepth = int(p.Iters)
	}
	return nil
}
