package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"syscall"

	"github.com/softrnic/softrnic/daemon/proto"
)

func init() {
	register("status", "show the daemon's device, attach mode, queues, QPs and clients", runStatus)
}

// statusReport is what softrnic status prints: the OPEN reply, the STATUS
// reply and the QPs from STATS (nil when the daemon keeps no counters).
type statusReport struct {
	Info   proto.DeviceInfo
	Status proto.StatusResp
	QPs    []proto.QPStats
	HaveQP bool // the daemon answered STATS
}

func runStatus(args []string) int {
	fs := flag.NewFlagSet("softrnic status", flag.ContinueOnError)
	control := fs.String("control", proto.DefaultControl, "the daemon's control socket")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: softrnic status [--control PATH]")
		fmt.Fprintln(fs.Output(), "\nRoot sees every client and QP; other users only their own connection.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	rep, err := queryStatus(*control)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic status:", err)
		return 1
	}
	if err := writeStatus(os.Stdout, rep); err != nil {
		fmt.Fprintln(os.Stderr, "softrnic status:", err)
		return 1
	}
	return 0
}

func queryStatus(path string) (*statusReport, error) {
	cc, err := dialControl(path)
	if err != nil {
		return nil, err
	}
	defer cc.c.Close()
	rep := statusReport{Info: cc.info}
	body, err := cc.call(proto.OpStatus, nil)
	if err == nil {
		err = proto.DecodeBody(body, &rep.Status)
	}
	if err != nil {
		return nil, err
	}
	st, err := cc.stats(-1)
	var pe *proto.Error
	switch {
	case err == nil:
		rep.QPs, rep.HaveQP = st.QPs, true
	case errors.As(err, &pe) && pe.Errno == syscall.EOPNOTSUPP:
		// a daemon without counters: no QP list
	default:
		return nil, err
	}
	return &rep, nil
}

// writeStatus prints the report as aligned "key  value" lines, then the
// QPs and the clients, one per line.
func writeStatus(w io.Writer, r *statusReport) error {
	var b strings.Builder
	info, st := &r.Info, &r.Status
	state := "DOWN"
	if info.PortActive {
		state = "ACTIVE"
	}
	fmt.Fprintf(&b, "device     %s  node_guid %016x  port 1 %s  mtu %d\n", cstring(info.Name[:]), info.NodeGUID, state, info.ActiveMTU)
	for i := 0; i < int(min(info.NumGIDs, uint32(len(info.GIDs)))); i++ {
		a := netip.AddrFrom16(info.GIDs[i]).Unmap()
		fmt.Fprintf(&b, "gid %-6d %s\n", i, a)
	}
	kind := cstring(st.Port.Kind[:])
	switch attach := cstring(st.Port.Attach[:]); {
	case attach != "":
		mode := "copy"
		if st.Port.ZeroCopy != 0 {
			mode = "zero-copy"
		}
		fmt.Fprintf(&b, "port       %s  XDP %s mode  %s\n", kind, attach, mode)
	default:
		fmt.Fprintf(&b, "port       %s\n", kind)
	}
	fmt.Fprintf(&b, "queues     %d\n", st.Port.Queues)
	if r.HaveQP {
		fmt.Fprintf(&b, "qps        %d\n", len(r.QPs))
	} else {
		fmt.Fprintf(&b, "qps        unknown (the daemon keeps no counters)\n")
	}
	for _, q := range r.QPs {
		fmt.Fprintf(&b, "  qpn %d  %s  %v\n", q.QPN, qpTypeString(q.Type), q.State)
	}
	listed := min(st.Listed, uint32(len(st.Clients)))
	fmt.Fprintf(&b, "clients    %d", st.NumClients)
	if listed < st.NumClients {
		fmt.Fprintf(&b, " (%d visible to you)", listed)
	}
	b.WriteByte('\n')
	for _, c := range st.Clients[:listed] {
		fmt.Fprintf(&b, "  client %d  pid %d uid %d gid %d  qps %d cqs %d mrs %d pds %d\n",
			c.ID, c.PID, c.UID, c.GID, c.QPs, c.CQs, c.MRs, c.PDs)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
