package host

import (
	"log/slog"
	"net"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/softrnic/softrnic/rnic"
)

// watchLink follows the interface's link state and gives it to the device
// as its port's (rnic.Device.SetPortActive: PORT_ACTIVE, PORT_ERR, and
// the state ibv_query_port reports), as the kernel's RDMA core does for a
// RoCE port from its netdev. A port is active while its interface is up
// and has a carrier (IFF_UP and IFF_RUNNING: net.FlagUp, net.FlagRunning). It stops when done closes.
func watchLink(ifindex int, dev *rnic.Device, done <-chan struct{}, log *slog.Logger) error {
	// The state as it is now, before anyone can ask: the kernel sets
	// IFF_RUNNING a while after the carrier (its link watch), so a port
	// opened on a link that just came up starts down and goes active.
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return err
	}
	dev.SetPortActive(linkActive(l.Attrs().Flags))
	updates := make(chan netlink.LinkUpdate, 16)
	opts := netlink.LinkSubscribeOptions{ListExisting: true, ErrorCallback: func(err error) {
		select {
		case <-done: // the socket closed under the reader: no error
		default:
			if log != nil {
				log.Warn("watching the link state", "err", err)
			}
		}
	}}
	if err := netlink.LinkSubscribeWithOptions(updates, done, opts); err != nil {
		return err
	}
	go func() {
		for u := range updates {
			if int(u.Index) != ifindex {
				continue
			}
			active := u.Header.Type != syscall.RTM_DELLINK && linkActive(u.Attrs().Flags)
			if dev.SetPortActive(active) && log != nil {
				log.Info("port state", "active", active, "flags", u.Attrs().RawFlags, "oper", u.Attrs().OperState.String())
			}
		}
	}()
	return nil
}

// linkActive reports whether an interface with these flags carries
// frames: administratively up, with a carrier.
func linkActive(flags net.Flags) bool {
	return flags&net.FlagUp != 0 && flags&net.FlagRunning != 0
}
