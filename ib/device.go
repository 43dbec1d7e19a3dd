package ib

// DeviceAttr are an RNIC's attributes: the fields of ibv_device_attr and
// ibv_port_attr that a RoCE device with one port reports.
type DeviceAttr struct {
	NodeGUID  uint64 // EUI-64 from the port's MAC, as rxe derives it
	MaxMRSize uint64
	MaxQP     uint32
	MaxQPWR   uint32
	MaxSGE    uint32
	MaxCQ     uint32
	MaxCQE    uint32
	MaxMR     uint32
	MaxPD     uint32
	MaxSRQ    uint32
	MaxSRQWR  uint32
	MaxInline uint32
	// MaxQPRdAtom is how many RDMA READ/atomics a QP may have outstanding,
	// as requester and as responder (max_qp_rd_atom, max_qp_init_rd_atom).
	MaxQPRdAtom uint32
	ActiveMTU   uint32 // the port's active MTU in bytes
	PortActive  bool
	_           [7]byte
}

// NodeGUID is the node GUID of a port with Ethernet address mac: its
// EUI-64, as rxe derives it.
func NodeGUID(mac [6]byte) uint64 {
	return uint64(mac[0]^2)<<56 | uint64(mac[1])<<48 | uint64(mac[2])<<40 | 0xff<<32 | 0xfe<<24 |
		uint64(mac[3])<<16 | uint64(mac[4])<<8 | uint64(mac[5])
}
