package daemon

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/bits"
	"net"
	"net/netip"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
)

// DefaultControl is where the daemon listens and where every client command
// (softrnic perf/rping/stats/status/capture) looks by default (--control).
const DefaultControl = proto.DefaultControl

// Config is the daemon's configuration: defaults, then the config file, then
// command-line flags, each overriding the one before.
//
// The file format (documented for users in contrib/softrnic.conf.example) is
// one "key = value" per line; '#' starts a comment; a "[dcqcn]" or "[swift]"
// line starts a section whose keys are written "dcqcn.KEY" ("swift.KEY") on
// the command line; a key may
// appear once, except gid, which accumulates. Every key is also a flag of the
// same name (--mtu 2048, --dcqcn.rpg_ai_rate 10).
type Config struct {
	Interface string       // interface; the Ethernet device the RNIC sits on
	Queues    int          // queues; RX queues to serve, 0 = all of the interface's
	UMEMSize  int64        // umem-size; bytes of AF_XDP UMEM per queue
	FrameSize int          // frame-size; bytes per UMEM frame, 0 = 2048 when the MTU fits, else 4096
	RxQPs     int          // rx-qps; QPs sending at once the receive buffers are sized for (host.Config.RxQPs)
	MTU       int          // mtu; RoCE path MTU (256..4096), 0 = largest the interface allows
	GIDs      []netip.Addr // gid; addresses used as GIDs, empty = the interface's
	Metrics   string       // metrics; Prometheus /metrics listen address, empty = off
	Port      string       // port; afxdp, afpacket or auto (AF_XDP, falling back to AF_PACKET)
	// Recovery (recovery) is the loss recovery of the RC QPs whose client
	// does not choose: selective (the default), adaptive or timeout.
	Recovery ib.Recovery

	// MetricsTokenFile (metrics-token-file) holds a bearer token every
	// scrape must send; with it, metrics may listen beyond loopback.
	MetricsTokenFile string
	// MetricsAllowPublic (metrics-allow-public) lets metrics listen beyond
	// loopback with no token: the operator vouches for the network.
	MetricsAllowPublic bool

	Control      string      // control; control socket path
	ControlMode  os.FileMode // control-mode; socket permission bits
	ControlGroup string      // control-group; group (name or id) allowed besides root, empty = root only

	LogLevel  string // log-level; debug, info, warn, error
	LogFormat string // log-format; text or json

	CC    CCConfig
	DCQCN DCQCNConfig

	// CMResponseTimeout (cm-response-timeout) is the rdma_cm agent's CM
	// response timeout, 4.096 µs × 2^t, and CMMaxRetries (cm-max-retries)
	// how often it resends an unanswered REQ, REP, DREQ or SIDR_REQ; 0:
	// the Linux CM's (20, about 4.3 s; 15). Together they bound how long
	// a connection to a silent peer takes to fail (UNREACHABLE).
	CMResponseTimeout uint8
	CMMaxRetries      uint8

	// Limits ([limits]: RESOURCE-per-SCOPE, e.g. qps-per-uid) bound what
	// clients take; 0 (unset) is the default sized from the host.
	Limits Limits
}

// CCConfig is the congestion control every RC and UC QP of the daemon's
// clients runs: the algorithm and its dilation, line rate and (Swift's)
// knobs. DCQCN's profile and knobs are DCQCNConfig's.
type CCConfig struct {
	// Algorithm (cc) is dcqcn (the default), swift, timely or off;
	// ALGORITHM:PROFILE picks a Swift or TIMELY profile (DCQCN's is
	// dcqcn.profile).
	Algorithm string
	// Scale (cc-scale) is the time dilation: rates ÷ S, delays × S.
	Scale float64
	// LineGbps (cc-line-gbps), if > 0, replaces the profile's line rate.
	LineGbps float64
	// Swift's knobs ([swift]: base_target, hop_scale, fs_range,
	// endpoint_target, hops), undilated; zero keeps the profile's.
	SwiftBaseTarget, SwiftHopScale, SwiftFSRange, SwiftEndpointTarget time.Duration
	SwiftHops                                                         int
}

// CCAlgorithms are the values of the cc key.
var CCAlgorithms = []string{"dcqcn", "swift", "timely", "off"}

// DCQCNConfig selects a DCQCN profile and, for the connectx profile,
// overrides single knobs of it. Knob names, units and ranges are those of
// congestion/dcqcn.ConnectX (the mlx5 ones), so a tuning read off a real NIC
// carries over unchanged.
type DCQCNConfig struct {
	Profile string            // dcqcn.profile; connectx, paper, hpcc-mlx or off
	Knobs   map[string]uint32 // dcqcn.<knob>; only the knobs set explicitly
	// HostCC (dcqcn.host_cc) is when the notification point signals host
	// congestion: on (the defaults), off, or fill=F,rx=R,hold=D
	// (dcqcn.ParseHostCC).
	HostCC dcqcn.HostCCConfig
}

// DCQCNProfiles are the profiles congestion/dcqcn implements; "off" disables
// rate control (CNPs are still generated for peers that react to them).
var DCQCNProfiles = []string{"connectx", "paper", "hpcc-mlx", "off"}

// ConnectX returns the ConnectX firmware defaults with the configured knobs
// applied.
func (d DCQCNConfig) ConnectX() (dcqcn.ConnectX, error) {
	cx := dcqcn.DefaultConnectX()
	for k, v := range d.Knobs {
		if err := cx.Set(k, v); err != nil {
			return cx, &KeyError{Key: "dcqcn." + k, Err: err}
		}
	}
	return cx, nil
}

// DefaultConfig is the configuration before any file or flag.
func DefaultConfig() Config {
	return Config{
		UMEMSize:    16 << 20,
		RxQPs:       64,
		FrameSize:   0,
		Control:     DefaultControl,
		ControlMode: 0o660,
		Port:        "auto",
		Recovery:    ib.RecoverySelective,
		LogLevel:    "info",
		LogFormat:   "text",
		CC:          CCConfig{Algorithm: "dcqcn", Scale: 1},
		DCQCN:       DCQCNConfig{Profile: "connectx", Knobs: map[string]uint32{}},
	}
}

// A key is one configuration setting, settable from the file and from a flag.
type key struct {
	name    string
	usage   string
	repeat  bool // may appear more than once (values accumulate)
	boolean bool // a flag that may stand alone (--key means --key=true)
	set     func(c *Config, v string) error
}

var keys = []key{
	{name: "interface", usage: "Ethernet interface the RNIC runs on (also -d)", set: func(c *Config, v string) error {
		if v == "" || len(v) > 15 || strings.ContainsAny(v, "/ \t") {
			return fmt.Errorf("%q is not an interface name (1-15 characters, no '/' or spaces)", v)
		}
		c.Interface = v
		return nil
	}},
	{name: "queues", usage: "RX queues to serve, one AF_XDP socket each; 0 = all", set: func(c *Config, v string) error {
		n, err := parseInt(v, 0, 256)
		c.Queues = int(n)
		return err
	}},
	{name: "umem-size", usage: "AF_XDP UMEM bytes per queue (suffixes K, M, G, KiB, MiB, GiB)", set: func(c *Config, v string) error {
		n, err := parseSize(v)
		c.UMEMSize = n
		return err
	}},
	{name: "rx-qps", usage: "QPs sending into the host at once that each queue's AF_XDP receive buffers are sized for, 32 frames of the MTU each (the UMEM grows beyond umem-size if need be); 1..4096", set: func(c *Config, v string) error {
		n, err := parseInt(v, 1, 4096)
		c.RxQPs = int(n)
		return err
	}},
	{name: "frame-size", usage: "bytes per UMEM frame: a power of two, 2048..65536; 0 = 2048 when the interface's MTU fits, else 4096", set: func(c *Config, v string) error {
		if v == "0" {
			c.FrameSize = 0
			return nil
		}
		n, err := parseInt(v, 2048, 65536)
		if err == nil && bits.OnesCount64(uint64(n)) != 1 {
			err = fmt.Errorf("%d is not a power of two", n)
		}
		c.FrameSize = int(n)
		return err
	}},
	{name: "mtu", usage: "RoCE path MTU: 256, 512, 1024, 2048 or 4096; 0 = largest the interface allows", set: func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || (n != 0 && n != 256 && n != 512 && n != 1024 && n != 2048 && n != 4096) {
			return fmt.Errorf("%q is not a RoCE MTU (256, 512, 1024, 2048, 4096, or 0 for automatic)", v)
		}
		c.MTU = n
		return nil
	}},
	{name: "gid", repeat: true, usage: "IPv4 or IPv6 address to use as a GID (repeatable); default: the interface's addresses", set: func(c *Config, v string) error {
		a, err := netip.ParseAddr(v)
		if err != nil || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
			return fmt.Errorf("%q is not a unicast IP address", v)
		}
		c.GIDs = append(c.GIDs, a.Unmap())
		return nil
	}},
	{name: "metrics", usage: "listen address (host:port) of the Prometheus /metrics endpoint; empty = off; beyond loopback only with metrics-token-file or metrics-allow-public", set: func(c *Config, v string) error {
		if v != "" {
			if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
				return fmt.Errorf("%q is not host:port", v)
			}
		}
		c.Metrics = v
		return nil
	}},
	{name: "metrics-token-file", usage: "file holding a bearer token /metrics requires (at least 16 characters, not readable by others); allows a non-loopback metrics address", set: func(c *Config, v string) error {
		c.MetricsTokenFile = v
		return nil
	}},
	{name: "metrics-allow-public", boolean: true, usage: "true: serve /metrics on a non-loopback address without a token", set: func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q is not true or false", v)
		}
		c.MetricsAllowPublic = b
		return nil
	}},
	{name: "port", usage: "how frames move: afxdp, afpacket, or auto (AF_XDP, else AF_PACKET)", set: func(c *Config, v string) error {
		if v != "afxdp" && v != "afpacket" && v != "auto" {
			return fmt.Errorf("%q is not afxdp, afpacket or auto", v)
		}
		c.Port = v
		return nil
	}},
	{name: "cm-response-timeout", usage: "rdma_cm's CM response timeout, 4.096 µs × 2^N (8..31); 0 = 20, as Linux", set: func(c *Config, v string) error {
		n, err := parseInt(v, 0, 31)
		if err == nil && n != 0 && n < 8 {
			err = fmt.Errorf("%d is under 8 (1 ms)", n)
		}
		c.CMResponseTimeout = uint8(n)
		return err
	}},
	{name: "cm-max-retries", usage: "rdma_cm's retransmissions of an unanswered REQ, REP, DREQ or SIDR_REQ (1..15); 0 = 15, as Linux", set: func(c *Config, v string) error {
		n, err := parseInt(v, 0, 15)
		c.CMMaxRetries = uint8(n)
		return err
	}},
	{name: "recovery", usage: "loss recovery of RC QPs: selective (selective repeat with softrnic peers, adaptive retransmission with any), adaptive (go-back-N on measured RTTs) or timeout (the local ACK timeout alone, as rxe)", set: func(c *Config, v string) error {
		m, err := ib.ParseRecovery(v)
		if err != nil || m == ib.RecoveryDefault {
			return fmt.Errorf("%q is not selective, adaptive or timeout", v)
		}
		c.Recovery = m
		return nil
	}},
	{name: "control", usage: "path of the control socket clients connect to", set: func(c *Config, v string) error {
		if !strings.HasPrefix(v, "/") || len(v) > 107 {
			return fmt.Errorf("%q is not an absolute path of at most 107 bytes", v)
		}
		c.Control = v
		return nil
	}},
	{name: "control-mode", usage: "permission bits of the control socket, octal; no bits for others", set: func(c *Config, v string) error {
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil || m > 0o770 || m&0o7 != 0 {
			return fmt.Errorf("%q must be octal owner/group bits only (e.g. 0660): others may never use the RNIC", v)
		}
		c.ControlMode = os.FileMode(m)
		return nil
	}},
	{name: "control-group", usage: "group (name or number) whose members may use the RNIC besides root; empty = root only", set: func(c *Config, v string) error {
		if v != "" {
			if _, err := LookupGroup(v); err != nil {
				return err
			}
		}
		c.ControlGroup = v
		return nil
	}},
	{name: "log-level", usage: "debug, info, warn or error", set: func(c *Config, v string) error {
		if _, err := parseLevel(v); err != nil {
			return err
		}
		c.LogLevel = v
		return nil
	}},
	{name: "log-format", usage: "text or json", set: func(c *Config, v string) error {
		if v != "text" && v != "json" {
			return fmt.Errorf("%q is not text or json", v)
		}
		c.LogFormat = v
		return nil
	}},
	{name: "cc", usage: "congestion control of the RC/UC QPs: dcqcn (profile: dcqcn.profile), swift or timely (optionally :PROFILE), or off", set: func(c *Config, v string) error {
		algo, profile, _ := strings.Cut(v, ":")
		if !slices.Contains(CCAlgorithms, algo) || strings.Contains(v, ":") && (profile == "" || algo == "off" || algo == "dcqcn") {
			return fmt.Errorf("%q is not %s (swift and timely may add :PROFILE; DCQCN's profile is dcqcn.profile)", v, strings.Join(CCAlgorithms, ", "))
		}
		c.CC.Algorithm = v
		return nil
	}},
	{name: "cc-scale", usage: "time dilation of congestion control: rates ÷ S, delays × S (>= 1)", set: func(c *Config, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f >= 1) || f > 1e9 {
			return fmt.Errorf("%q is not a number from 1 to 1e9", v)
		}
		c.CC.Scale = f
		return nil
	}},
	{name: "cc-line-gbps", usage: "line rate congestion control starts at and never exceeds, Gb/s (0: the profile's)", set: func(c *Config, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f >= 0) || f > 1e4 {
			return fmt.Errorf("%q is not a rate in Gb/s from 0 to 10000", v)
		}
		c.CC.LineGbps = f
		return nil
	}},
	{name: "swift.base_target", usage: "Swift: fabric target delay of a one-hop path, undilated (e.g. 25us; 0: the profile's)", set: func(c *Config, v string) error {
		return parseDelay(v, &c.CC.SwiftBaseTarget)
	}},
	{name: "swift.hop_scale", usage: "Swift: target delay added per switch hop, undilated (0: the profile's)", set: func(c *Config, v string) error {
		return parseDelay(v, &c.CC.SwiftHopScale)
	}},
	{name: "swift.fs_range", usage: "Swift: most the flow scaling adds to the target, undilated (0: the profile's)", set: func(c *Config, v string) error {
		return parseDelay(v, &c.CC.SwiftFSRange)
	}},
	{name: "swift.endpoint_target", usage: "Swift: endpoint (host) delay target, undilated (0: the profile's)", set: func(c *Config, v string) error {
		return parseDelay(v, &c.CC.SwiftEndpointTarget)
	}},
	{name: "swift.hops", usage: "Swift: switches between this host and its peers (0: the profile's, 1)", set: func(c *Config, v string) error {
		n, err := parseInt(v, 0, 64)
		c.CC.SwiftHops = int(n)
		return err
	}},
	{name: "dcqcn.profile", usage: "DCQCN profile: " + strings.Join(DCQCNProfiles, ", "), set: func(c *Config, v string) error {
		for _, p := range DCQCNProfiles {
			if v == p {
				c.DCQCN.Profile = v
				return nil
			}
		}
		return fmt.Errorf("%q is not a DCQCN profile (%s)", v, strings.Join(DCQCNProfiles, ", "))
	}},
	{name: "dcqcn.host_cc", usage: "DCQCN: CNPs for host congestion: on, off, or fill=F,rx=R,hold=D (fewer than F of the receive buffers wait for the network, or R wait for the reader; for D after)", set: func(c *Config, v string) error {
		h, err := dcqcn.ParseHostCC(v)
		c.DCQCN.HostCC = h
		return err
	}},
}

func init() {
	keys = append(keys, limitKeys()...)
	for _, k := range dcqcn.KnobNames() {
		k := k
		keys = append(keys, key{name: "dcqcn." + k, usage: "DCQCN ConnectX knob " + k + " (mlx5 units); default from the firmware",
			set: func(c *Config, v string) error {
				n, err := strconv.ParseUint(v, 10, 32)
				if err != nil {
					return fmt.Errorf("%q is not a non-negative integer", v)
				}
				cx := dcqcn.DefaultConnectX()
				if err := cx.Set(k, uint32(n)); err != nil {
					return err
				}
				if c.DCQCN.Knobs == nil {
					c.DCQCN.Knobs = map[string]uint32{}
				}
				c.DCQCN.Knobs[k] = uint32(n)
				return nil
			}})
	}
}

// limitKeys are the [limits] keys: RESOURCE-per-SCOPE for each limit that
// applies (connections have no per-connection limit, other objects only
// a per-connection one).
func limitKeys() []key {
	var ks []key
	for r := Resource(0); r < NumResources; r++ {
		for sc := Scope(0); sc < NumScopes; sc++ {
			if r == Connections && sc == PerConn || r == Objects && sc != PerConn {
				continue
			}
			r, sc := r, sc
			unit := "count"
			if r == MRBytes || r == QueueBytes {
				unit = "bytes (suffixes K, M, G, KiB, MiB, GiB)"
			}
			ks = append(ks, key{name: "limits." + r.String() + "-per-" + sc.String(),
				usage: fmt.Sprintf("most %s %s may hold, %s; unlimited, or 0 for the default sized from the host", r, scopeWhose[sc], unit),
				set: func(c *Config, v string) error {
					n, err := parseLimit(v, r == MRBytes || r == QueueBytes)
					c.Limits[r][sc] = n
					return err
				}})
		}
	}
	return ks
}

var scopeWhose = [NumScopes]string{"one client connection", "the connections of one uid", "all clients together"}

// parseLimit reads a limit: a count (or a size, for bytes), 0 for the
// default, or "unlimited".
func parseLimit(v string, size bool) (int64, error) {
	if v == "unlimited" {
		return -1, nil
	}
	if v == "0" {
		return 0, nil
	}
	if size {
		return parseSize(v)
	}
	return parseInt(v, 0, 1<<40)
}

func findKey(name string) *key {
	for i := range keys {
		if keys[i].name == name {
			return &keys[i]
		}
	}
	return nil
}

// KeyError is a configuration error attributed to one key (and, for the
// file, to one line), so that the message points at what to fix.
type KeyError struct {
	Source string // file name, or "flag"
	Line   int    // 0 for flags and whole-config checks
	Key    string
	Err    error
}

func (e *KeyError) Error() string {
	switch {
	case e.Line > 0:
		return fmt.Sprintf("%s:%d: %s: %v", e.Source, e.Line, e.Key, e.Err)
	case e.Source != "":
		return fmt.Sprintf("%s: %s: %v", e.Source, e.Key, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Key, e.Err)
}

func (e *KeyError) Unwrap() error { return e.Err }

// ParseFile applies a configuration file to c.
func (c *Config) ParseFile(name string, r io.Reader) error {
	sc := bufio.NewScanner(r)
	section := ""
	seen := map[string]int{}
	line := 0
	for sc.Scan() {
		line++
		s := sc.Text()
		if i := strings.IndexByte(s, '#'); i >= 0 {
			s = s[:i]
		}
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if strings.HasPrefix(s, "[") {
			if !strings.HasSuffix(s, "]") {
				return &KeyError{Source: name, Line: line, Key: s, Err: errors.New("unterminated section header")}
			}
			section = strings.TrimSpace(s[1 : len(s)-1])
			if section != "dcqcn" && section != "swift" && section != "limits" {
				return &KeyError{Source: name, Line: line, Key: "[" + section + "]", Err: errors.New("unknown section (known: [dcqcn], [swift], [limits])")}
			}
			continue
		}
		k, v, ok := strings.Cut(s, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return &KeyError{Source: name, Line: line, Key: s, Err: errors.New(`not "key = value"`)}
		}
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			uq, err := strconv.Unquote(v)
			if err != nil {
				return &KeyError{Source: name, Line: line, Key: k, Err: fmt.Errorf("bad quoted string: %w", err)}
			}
			v = uq
		}
		if section != "" {
			k = section + "." + k
		}
		kk := findKey(k)
		if kk == nil {
			return &KeyError{Source: name, Line: line, Key: k, Err: errors.New("unknown key" + suggest(k))}
		}
		if prev, dup := seen[k]; dup && !kk.repeat {
			return &KeyError{Source: name, Line: line, Key: k, Err: fmt.Errorf("set twice (first on line %d)", prev)}
		}
		seen[k] = line
		if err := kk.set(c, v); err != nil {
			return &KeyError{Source: name, Line: line, Key: k, Err: err}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// suggest names a known key close to an unknown one (same name in another
// section, or differing by '-' versus '_').
func suggest(k string) string {
	norm := func(s string) string { return strings.ReplaceAll(s, "_", "-") }
	for _, kk := range keys {
		base := kk.name[strings.LastIndexByte(kk.name, '.')+1:]
		if norm(kk.name) == norm(k) || base == k {
			return fmt.Sprintf(" (did you mean %q?)", kk.name)
		}
	}
	return ""
}

// Validate checks what no single key can: required keys and relations
// between keys.
func (c *Config) Validate() error {
	if c.Interface == "" {
		return &KeyError{Key: "interface", Err: errors.New("required (set it in the file, or with -d IFACE)")}
	}
	fs := c.FrameSize
	if fs == 0 {
		fs = 4096 // the larger of the automatic sizes
	}
	if c.MTU != 0 && c.FrameSize != 0 && c.MTU+MaxRoCEOverhead > c.FrameSize {
		return &KeyError{Key: "mtu", Err: fmt.Errorf("mtu %d plus %d bytes of headers does not fit frame-size %d", c.MTU, MaxRoCEOverhead, c.FrameSize)}
	}
	if c.UMEMSize%int64(fs) != 0 || c.UMEMSize/int64(fs) < MinUMEMFrames {
		return &KeyError{Key: "umem-size", Err: fmt.Errorf("%d must be a multiple of frame-size %d and hold at least %d frames", c.UMEMSize, fs, MinUMEMFrames)}
	}
	if c.Metrics != "" && c.MetricsTokenFile == "" && !c.MetricsAllowPublic && !loopbackHostPort(c.Metrics) {
		return &KeyError{Key: "metrics", Err: fmt.Errorf("%q: %w", c.Metrics, ErrMetricsPublic)}
	}
	if len(c.DCQCN.Knobs) > 0 && c.DCQCN.Profile != "connectx" {
		for k := range c.DCQCN.Knobs {
			return &KeyError{Key: "dcqcn." + k, Err: fmt.Errorf("knobs apply to dcqcn.profile connectx, not %s", c.DCQCN.Profile)}
		}
	}
	algo, _, _ := strings.Cut(c.CC.Algorithm, ":")
	if len(c.DCQCN.Knobs) > 0 && algo != "dcqcn" {
		for k := range c.DCQCN.Knobs {
			return &KeyError{Key: "dcqcn." + k, Err: fmt.Errorf("knobs apply to cc dcqcn, not %s", c.CC.Algorithm)}
		}
	}
	cc := &c.CC
	if algo != "swift" && (cc.SwiftBaseTarget != 0 || cc.SwiftHopScale != 0 || cc.SwiftFSRange != 0 || cc.SwiftEndpointTarget != 0 || cc.SwiftHops != 0) {
		return &KeyError{Key: "swift", Err: fmt.Errorf("swift keys apply to cc swift, not %s", c.CC.Algorithm)}
	}
	return nil
}

// parseDelay reads a non-negative duration (Go syntax: 25us, 1.5ms).
func parseDelay(v string, dst *time.Duration) error {
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > time.Second {
		return fmt.Errorf("%q is not a delay from 0 to 1s (e.g. 25us)", v)
	}
	*dst = d
	return nil
}

// loopbackHostPort reports whether host:port names a loopback address:
// a loopback IP, or localhost. Any other name might resolve anywhere.
func loopbackHostPort(hp string) bool {
	host, _, err := net.SplitHostPort(hp)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// MetricsOptions returns the access control of the metrics endpoint, for
// ServeMetrics: the token of metrics-token-file (read now, so a restart
// picks up a new one) and metrics-allow-public.
func (c *Config) MetricsOptions() ([]MetricsOption, error) {
	var opts []MetricsOption
	if c.MetricsTokenFile != "" {
		tok, err := ReadMetricsToken(c.MetricsTokenFile)
		if err != nil {
			return nil, &KeyError{Key: "metrics-token-file", Err: err}
		}
		opts = append(opts, WithBearerToken(tok))
	}
	if c.MetricsAllowPublic {
		opts = append(opts, AllowPublic())
	}
	return opts, nil
}

// MaxRoCEOverhead is the most header and trailer bytes around a RoCEv2
// payload of one path MTU: Ethernet 14, VLAN 4, IPv6 40, UDP 8, BTH 12,
// RETH 16 (the largest extension carried with payload), ImmDt 4, ICRC 4.
const MaxRoCEOverhead = 14 + 4 + 40 + 8 + 12 + 16 + 4 + 4

// MinUMEMFrames is the fewest frames a UMEM may hold: the fill and
// completion rings need room for a few batches each.
const MinUMEMFrames = 256

// Flags binds every configuration key to a flag of the same name in fs, plus
// --config FILE and -d (short for --interface). Flag values are recorded,
// not applied: Load applies them after the file so that flags win.
type Flags struct {
	configPath string
	sets       []flagSet
}

type flagSet struct{ key, value string }

type keyFlag struct {
	f    *Flags
	name string
}

func (k keyFlag) String() string { return "" }

// IsBoolFlag lets a boolean key's flag stand alone, as flag.Bool does.
func (k keyFlag) IsBoolFlag() bool { kk := findKey(k.name); return kk != nil && kk.boolean }
func (k keyFlag) Set(v string) error {
	kk := findKey(k.name)
	// Check now, so the flag package reports the bad flag with its usage.
	var scratch Config
	if err := kk.set(&scratch, v); err != nil {
		return err
	}
	k.f.sets = append(k.f.sets, flagSet{k.name, v})
	return nil
}

// RegisterFlags adds the configuration flags to fs.
func RegisterFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{}
	fs.StringVar(&f.configPath, "config", "", "configuration `file` (key = value lines; flags override it)")
	for _, k := range keys {
		fs.Var(keyFlag{f, k.name}, k.name, k.usage)
	}
	fs.Var(keyFlag{f, "interface"}, "d", "Ethernet interface the RNIC runs on")
	return f
}

// Load builds the configuration: defaults, then the --config file if given,
// then the flags in command-line order; then validates it.
func (f *Flags) Load() (Config, error) {
	c := DefaultConfig()
	if f.configPath != "" {
		fh, err := os.Open(f.configPath)
		if err != nil {
			return c, err
		}
		err = c.ParseFile(f.configPath, fh)
		_ = fh.Close() // read only
		if err != nil {
			return c, err
		}
	}
	gidFromFlags := false
	for _, s := range f.sets {
		if s.key == "gid" && !gidFromFlags {
			c.GIDs, gidFromFlags = nil, true // flags replace the file's list rather than extend it
		}
		if err := findKey(s.key).set(&c, s.value); err != nil {
			return c, &KeyError{Source: "flag", Key: "--" + s.key, Err: err}
		}
	}
	return c, c.Validate()
}

// LookupGroup resolves a group name or number to a gid.
func LookupGroup(v string) (uint32, error) {
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return uint32(n), nil
	}
	g, err := user.LookupGroup(v)
	if err != nil {
		return 0, fmt.Errorf("no group %q", v)
	}
	n, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("group %q has a non-numeric gid %q", v, g.Gid)
	}
	return uint32(n), nil
}

func parseInt(v string, lo, hi int64) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return n, fmt.Errorf("%q is not an integer in %d..%d", v, lo, hi)
	}
	return n, nil
}

// parseSize reads a byte count with an optional binary suffix (K, M, G,
// KiB, MiB, GiB: all powers of 1024, as memory is counted).
func parseSize(v string) (int64, error) {
	num := strings.TrimRight(v, "KMGBikmgb")
	unit := strings.ToLower(v[len(num):])
	mult := map[string]int64{"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}[unit]
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || mult == 0 || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("%q is not a size (e.g. 16MiB)", v)
	}
	return n * mult, nil
}
