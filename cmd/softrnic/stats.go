package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
)

func init() {
	register("stats", "print the daemon's counters as rdma statistic show does", runStats)
}

// statsReport is every counter of one STATS query, all pages gathered.
type statsReport struct {
	Device string
	Valid  uint64
	Values [proto.NumDeviceCounters]uint64
	HasCM  bool
	CM     [proto.NumCMCounters]uint64 // the daemon's rdma_cm, on the device's line
	QPs    []proto.QPStats
	// Queues are the receive queues the daemon details (AF_XDP ports);
	// NumQueues may be larger (only MaxStatsQueues are detailed).
	NumQueues int
	Queues    []proto.QueueStats
	Daemon    [proto.NumDaemonCounters]uint64
}

func runStats(args []string) int {
	fs := flag.NewFlagSet("softrnic stats", flag.ContinueOnError)
	control := fs.String("control", proto.DefaultControl, "the daemon's control socket")
	qp := fs.Int("qp", -1, "print only this QP's counters (QPN)")
	asJSON := fs.Bool("json", false, "print JSON instead of rdma-style lines")
	fs.Usage = func() {
		o := fs.Output()
		fmt.Fprintln(o, "usage: softrnic stats [--control PATH] [--qp N] [--json]")
		fmt.Fprintln(o, "\nPrints the device's counters on one line, then one line per QP, named as")
		fmt.Fprintln(o, "rdma statistic names them (rxe and mlx5 hw_counters). Root sees every QP,")
		fmt.Fprintln(o, "other users only the QPs of their own connection (none, for this command).")
		fs.PrintDefaults()
		fmt.Fprintln(o, "With an AF_XDP port, one line per receive queue follows the device's.")
		fmt.Fprintln(o, "\nNot counted (never printed, rather than as zeros that mean nothing):")
		for _, d := range proto.NotCounted {
			fmt.Fprintf(o, "  %-26s %s\n", d.Name, d.Help)
		}
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || *qp > 0xffffff {
		fs.Usage()
		return 2
	}
	rep, err := queryStats(*control, *qp)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic stats:", err)
		return 1
	}
	if *qp >= 0 && len(rep.QPs) == 0 {
		fmt.Fprintf(os.Stderr, "softrnic stats: no QP %d (or not yours)\n", *qp)
		return 1
	}
	if *asJSON {
		err = writeStatsJSON(os.Stdout, rep, *qp >= 0)
	} else {
		err = writeStatsText(os.Stdout, rep, *qp >= 0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic stats:", err)
		return 1
	}
	return 0
}

// controlConn is a bare control connection, opened with OPEN: enough for
// the queries of stats and status, which need no doorbell.
type controlConn struct {
	c    *proto.Conn
	seq  uint32
	info proto.DeviceInfo // OPEN's reply
}

func dialControl(path string) (*controlConn, error) {
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("connecting to the daemon at %s: %w", path, err)
	}
	cc := &controlConn{c: proto.NewConn(uc)}
	body, err := cc.call(proto.OpOpen, &proto.OpenReq{Version: proto.Version})
	if err == nil {
		err = proto.DecodeBody(body, &cc.info)
	}
	if err != nil {
		uc.Close()
		return nil, err
	}
	return cc, nil
}

// call sends one request and returns its reply's body (valid until the
// next call). Received fds (OPEN's doorbell) are closed: not needed here.
func (cc *controlConn) call(op proto.Op, req any) ([]byte, error) {
	cc.seq++
	if err := cc.c.Send(proto.Header{Op: op, Seq: cc.seq}, req); err != nil {
		return nil, fmt.Errorf("%v: %w", op, err)
	}
	h, body, fds, err := cc.c.Recv()
	proto.CloseFDs(fds)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", op, err)
	}
	if h.Op != op || h.Seq != cc.seq {
		return nil, fmt.Errorf("%v: reply for %v #%d", op, h.Op, h.Seq)
	}
	if h.Errno != 0 {
		return nil, &proto.Error{Op: op, Errno: errnoOf(h.Errno), Msg: string(body)}
	}
	return body, nil
}

// stats gathers every page of OpStats (all QPs, or only qp if qp >= 0).
func (cc *controlConn) stats(qp int) (*statsReport, error) {
	var rep statsReport
	req := proto.StatsReq{}
	if qp >= 0 {
		req.QPN, req.FilterQP = uint32(qp), 1
	}
	for page := 0; ; page++ {
		body, err := cc.call(proto.OpStats, &req)
		if err != nil {
			return nil, err
		}
		var r proto.StatsResp
		if err := proto.DecodeBody(body, &r); err != nil {
			return nil, err
		}
		if page == 0 {
			rep.Device, rep.Valid, rep.Values, rep.Daemon = cstring(r.Name[:]), r.Valid, r.Device, r.Daemon
			rep.HasCM, rep.CM = r.HasCM != 0, r.CM
			rep.NumQueues = int(r.NumQueues)
			rep.Queues = append(rep.Queues, r.Queues[:min(int(r.NumQueues), len(r.Queues))]...)
		}
		if r.Listed > uint32(len(r.QPs)) {
			return nil, errors.New("STATS: reply lists more QPs than it holds")
		}
		rep.QPs = append(rep.QPs, r.QPs[:r.Listed]...)
		// Bounded: each page starts past the last QPN of the one before,
		// and QPNs are 24 bits.
		if r.More == 0 || r.Listed == 0 || page > 1<<24/proto.MaxStatsQPs {
			return &rep, nil
		}
		req.FromQPN = r.QPs[r.Listed-1].QPN + 1
	}
}

func queryStats(path string, qp int) (*statsReport, error) {
	cc, err := dialControl(path)
	if err != nil {
		return nil, err
	}
	defer cc.c.Close()
	return cc.stats(qp)
}

func cstring(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func qpTypeString(t ib.QPType) string {
	switch t {
	case ib.RC:
		return "RC"
	case ib.UC:
		return "UC"
	case ib.UD:
		return "UD"
	default:
		return fmt.Sprintf("type%d", t)
	}
}

// writeStatsText prints like rdma statistic show: "link DEV/1 name value
// ..." for the device, then for each receive queue of an AF_XDP port
// "link DEV/1 queue N rx_packets X xsk_rx_ring_full Y", then the daemon's
// own counters as "daemon DEV name value ...", then for each QP
// "link DEV/1 lqpn N type RC state RTS name value ...", as rdma statistic
// qp show does. Counters this port does not count are left out.
func writeStatsText(w io.Writer, r *statsReport, qpOnly bool) error {
	var b strings.Builder
	if !qpOnly {
		fmt.Fprintf(&b, "link %s/1", r.Device)
		for i, d := range proto.DeviceCounters {
			if r.Valid&(1<<i) != 0 {
				fmt.Fprintf(&b, " %s %d", d.Name, r.Values[i])
			}
		}
		for i, d := range proto.CMCounters {
			if r.HasCM {
				fmt.Fprintf(&b, " %s %d", d.Name, r.CM[i])
			}
		}
		b.WriteByte('\n')
		for i, q := range r.Queues {
			fmt.Fprintf(&b, "link %s/1 queue %d rx_packets %d xsk_rx_ring_full %d\n", r.Device, i, q.RxPackets, q.RxRingFull)
		}
		if r.NumQueues > len(r.Queues) {
			fmt.Fprintf(&b, "link %s/1 queues %d (the first %d shown)\n", r.Device, r.NumQueues, len(r.Queues))
		}
		fmt.Fprintf(&b, "daemon %s", r.Device)
		for i, d := range proto.DaemonCounters {
			fmt.Fprintf(&b, " %s %d", d.Name, r.Daemon[i])
		}
		b.WriteByte('\n')
	}
	for _, q := range r.QPs {
		fmt.Fprintf(&b, "link %s/1 lqpn %d type %s state %v", r.Device, q.QPN, qpTypeString(q.Type), q.State)
		for i, d := range proto.QPCounters {
			if q.Valid&(1<<i) != 0 {
				fmt.Fprintf(&b, " %s %d", d.Name, q.Values[i])
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

type statsJSONQP struct {
	LQPN     uint32            `json:"lqpn"`
	Type     string            `json:"type"`
	State    string            `json:"state"`
	Counters map[string]uint64 `json:"counters"`
}

type statsJSONQueue struct {
	Queue      int    `json:"queue"`
	RxPackets  uint64 `json:"rx_packets"`
	RxRingFull uint64 `json:"xsk_rx_ring_full"`
}

type statsJSON struct {
	Ifname     string            `json:"ifname"`
	Port       int               `json:"port"`
	Counters   map[string]uint64 `json:"counters,omitempty"`
	Daemon     map[string]uint64 `json:"daemon,omitempty"`
	NumQueues  int               `json:"num_queues,omitempty"`
	Queues     []statsJSONQueue  `json:"queues,omitempty"`
	QPs        []statsJSONQP     `json:"qps"`
	NotCounted []string          `json:"not_counted"`
}

// writeStatsJSON prints one JSON object: the device's counters, its
// receive queues', the QPs' and the names of the counters softrnic does
// not count.
func writeStatsJSON(w io.Writer, r *statsReport, qpOnly bool) error {
	out := statsJSON{Ifname: r.Device, Port: 1, QPs: []statsJSONQP{}}
	if !qpOnly {
		out.Counters = map[string]uint64{}
		for i, d := range proto.DeviceCounters {
			if r.Valid&(1<<i) != 0 {
				out.Counters[d.Name] = r.Values[i]
			}
		}
		for i, d := range proto.CMCounters {
			if r.HasCM {
				out.Counters[d.Name] = r.CM[i]
			}
		}
		out.Daemon = map[string]uint64{}
		for i, d := range proto.DaemonCounters {
			out.Daemon[d.Name] = r.Daemon[i]
		}
		out.NumQueues = r.NumQueues
		for i, q := range r.Queues {
			out.Queues = append(out.Queues, statsJSONQueue{Queue: i, RxPackets: q.RxPackets, RxRingFull: q.RxRingFull})
		}
	}
	for _, q := range r.QPs {
		jq := statsJSONQP{LQPN: q.QPN, Type: qpTypeString(q.Type), State: q.State.String(), Counters: map[string]uint64{}}
		for i, d := range proto.QPCounters {
			if q.Valid&(1<<i) != 0 {
				jq.Counters[d.Name] = q.Values[i]
			}
		}
		out.QPs = append(out.QPs, jq)
	}
	for _, d := range proto.NotCounted {
		out.NotCounted = append(out.NotCounted, d.Name)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func errnoOf(e uint32) syscall.Errno { return syscall.Errno(e) }
