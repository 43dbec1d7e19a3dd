package rnic

// UDSourcePort is the UDP source port rxe gives the packets of the UD QP
// qpn: hash_32(qpn, 14) in the RoCEv2 entropy range [0xC000, 0xFFFF]
// (rdma_get_udp_sport with a zero flow label and no remote QPN falls back
// to it). An AddressVector with UDPSrcPort 0 gets a port from the flow
// label and QPNs it knows, which for an address handle (no QPN at all) is
// a constant; a UD application that wants its frames to look like rxe's —
// spread by ECMP per QP the way a kernel peer's are — sets
// AddressVector.UDPSrcPort to UDSourcePort(its QP's number).
func UDSourcePort(qpn uint32) uint16 {
	return 0xC000 | uint16((qpn*0x61C88647)>>(32-14))
}
