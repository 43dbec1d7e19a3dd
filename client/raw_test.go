package client

import (
	"net"

	"github.com/softrnic/softrnic/daemon/proto"
)

func netDialPacket(path string) (*proto.Conn, error) {
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	return proto.NewConn(uc), nil
}
