package pingpong

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/host"
)

// Transport is the QP type of the test.
type Transport int

const (
	RC Transport = iota // ibv_rc_pingpong
	UD                  // ibv_ud_pingpong
)

func (t Transport) String() string {
	if t == UD {
		return "ud"
	}
	return "rc"
}

// Params are the stock tools' options (the same letters and defaults).
type Params struct {
	Transport Transport
	Device    string // -d: the network interface (the stock tools' IB device)
	Port      int    // -p: TCP port of the side channel (18515)
	IBPort    int    // -i: accepted; a softrnic device has one port
	Size      int    // -s: message size (RC 4096, UD 1024)
	MTU       int    // -m: RC path MTU in bytes (1024)
	RxDepth   int    // -r: receives kept posted (500)
	Iters     int    // -n: iterations (1000)
	SL        int    // -l: accepted; RoCE has no SL on the wire here
	Events    bool   // -e: sleep on CQ events (we always wait on the CQ)
	GIDIndex  int    // -g: GID index (-1: the device's default GID)
	Check     bool   // -c/--chk: validate received buffers
	Host      string // the server to connect to; empty: be the server
	// CC and CCScale are --cc ALGORITHM[:PROFILE] and --cc-scale S:
	// congestion control of the QP's device (host.ParseCC; default off);
	// HostCC is --host-cc, DCQCN's host-congestion signal
	// (dcqcn.ParseHostCC; "": on, the defaults).
	CC      string
	CCScale float64
	HostCC  string
}

// DefaultParams are the stock tools' defaults for t.
func DefaultParams(t Transport) Params {
	p := Params{Transport: t, Port: 18515, IBPort: 1, Size: 4096, MTU: 1024, RxDepth: 500, Iters: 1000, GIDIndex: -1, CCScale: 1}
	if t == UD {
		p.Size = 1024
	}
	return p
}

// softrnic's long-only options, in ParseArgs' table of option letters.
const (
	optCC      = 1
	optCCScale = 2
	optHostCC  = 3
)

// ErrHelp is returned for -h/--help.
var ErrHelp = errors.New("help requested")

// Usage lists the options.
const Usage = `  -p, --port=<port>      listen on/connect to port <port> (default 18515)
  -d, --ib-dev=<dev>     network interface to run RoCE on (required without --daemon)
  -i, --ib-port=<port>   port of the device (default 1; softrnic has one)
  -s, --size=<size>      size of message to exchange (rc 4096, ud 1024)
  -m, --mtu=<size>       path MTU (rc only; default 1024)
  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)
  -n, --iters=<iters>    number of exchanges (default 1000)
  -l, --sl=<sl>          service level value (accepted, unused on RoCE)
  -e, --events           sleep on CQ events (default poll)
  -g, --gid-idx=<gid>    local port gid index (default: the interface's
                         IPv4 address, else its first global one)
  -c, --chk              validate received buffer (every message, whole,
                         on both ends: a --chk server expects a --chk
                         client's page marks, as the stock client sends)
      --cc=ALGO[:PROFILE]  congestion control: off (default), dcqcn, swift, timely
      --cc-scale=S       its time dilation: rates ÷ S, delays × S (default 1)
      --host-cc=on|off|fill=F,rx=R,hold=D  DCQCN's host-congestion signal (default on)
`

// ParseArgs parses the stock tools' command line (options and the server
// name in any order, as getopt_long permutes them).
func ParseArgs(t Transport, args []string) (Params, error) {
	p := DefaultParams(t)
	long := map[string]byte{"port": 'p', "ib-dev": 'd', "ib-port": 'i', "size": 's', "mtu": 'm', "rx-depth": 'r',
		"iters": 'n', "sl": 'l', "events": 'e', "gid-idx": 'g', "chk": 'c', "help": 'h', "cc": optCC, "cc-scale": optCCScale,
		"host-cc": optHostCC}
	hasArg := "pdismrnlg" + string(rune(optCC)) + string(rune(optCCScale)) + string(rune(optHostCC))
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		var opt byte
		var val string
		inline := false
		if strings.HasPrefix(a, "--") {
			name := a[2:]
			if k := strings.IndexByte(name, '='); k >= 0 {
				name, val, inline = name[:k], name[k+1:], true
			}
			o, ok := long[name]
			if !ok {
				return p, fmt.Errorf("unknown option %s", a)
			}
			opt = o
		} else {
			opt = a[1]
			if len(a) > 2 {
				val, inline = a[2:], true
			}
		}
		if opt == 'h' {
			return p, ErrHelp
		}
		if strings.IndexByte(hasArg, opt) >= 0 {
			if !inline {
				if i+1 >= len(args) {
					return p, fmt.Errorf("option %s needs a value", a)
				}
				i++
				val = args[i]
			}
		} else if inline {
			return p, fmt.Errorf("option %s takes no value", a)
		}
		if err := p.set(opt, val); err != nil {
			return p, fmt.Errorf("option %s: %w", a, err)
		}
	}
	switch len(pos) {
	case 0:
	case 1:
		p.Host = pos[0]
	default:
		return p, fmt.Errorf("one server name at most, got %q", pos)
	}
	return p, p.validate()
}

func (p *Params) set(opt byte, val string) error {
	num := func(lo, hi int) (int, error) {
		v, err := strconv.ParseInt(val, 0, 64) // strtol/strtoul accept 0x...
		if err != nil || v < int64(lo) || v > int64(hi) {
			return 0, fmt.Errorf("bad value %q (%d..%d)", val, lo, hi)
		}
		return int(v), nil
	}
	var err error
	switch opt {
	case 'p':
		p.Port, err = num(1, 65535)
	case 'd':
		p.Device = val
	case 'i':
		p.IBPort, err = num(1, 255)
	case 's':
		p.Size, err = num(1, 1<<30)
	case 'm':
		p.MTU, err = num(256, 4096)
		if err == nil && p.MTU&(p.MTU-1) != 0 {
			err = fmt.Errorf("bad MTU %d (256, 512, 1024, 2048 or 4096)", p.MTU)
		}
	case 'r':
		p.RxDepth, err = num(1, 1<<16)
	case 'n':
		p.Iters, err = num(1, 1<<31-1)
	case 'l':
		p.SL, err = num(0, 15)
	case 'e':
		p.Events = true
	case 'g':
		p.GIDIndex, err = num(0, 255)
	case 'c':
		p.Check = true
	case optCC:
		p.CC = val
		_, _, err = host.ParseCC(val, "")
	case optCCScale:
		f, ferr := strconv.ParseFloat(val, 64)
		if ferr != nil || !(f >= 1) || f > 1e9 {
			err = fmt.Errorf("bad value %q (a number from 1 to 1e9)", val)
		}
		p.CCScale = f
	case optHostCC:
		p.HostCC = val
		_, err = dcqcn.ParseHostCC(val)
	default:
		err = errors.New("unknown option")
	}
	return err
}

// validate checks the flags together. -d is checked by RunCLI: with
// --daemon the daemon's interface is implied.
func (p *Params) validate() error {
	if p.RxDepth < 2 {
		// The loop reposts when one receive is left: fewer than two would
		// leave none posted for the next message.
		return fmt.Errorf("rx-depth %d: at least 2", p.RxDepth)
	}
	return nil
}
