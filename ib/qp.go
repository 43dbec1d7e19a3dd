package ib

import (
	"net/netip"
	"strings"
)

// QPType is the transport service of a QP (ibv_qp_type; GSI as the
// kernel's IB_QPT_GSI).
type QPType uint8

// QP types softrnic implements.
const (
	// GSI is the General Services Interface QP, QP1: a UD QP whose QPN is
	// 1 and whose Q_Key is 0x80010000, which carries the CM's MADs. One
	// per device, owned by the device's CM agent, never by an application
	// of the daemon.
	GSI QPType = 1
	RC  QPType = 2
	UC  QPType = 3
	UD  QPType = 4
)

func (t QPType) String() string {
	switch t {
	case GSI:
		return "GSI"
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	}
	return "QPT_?"
}

// Datagram reports whether QPs of type t are unreliable datagram QPs.
func (t QPType) Datagram() bool { return t == UD || t == GSI }

// Connected reports whether QPs of type t are connected (RC or UC).
func (t QPType) Connected() bool { return t == RC || t == UC }

// QPState is the IB QP state (IBA 10.3.1; ibv_qp_state).
type QPState uint8

// QP states.
const (
	Reset QPState = iota
	Init
	RTR
	RTS
	SQD
	SQE
	Err
)

func (s QPState) String() string {
	if s <= Err {
		return [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}[s]
	}
	return "QPS_?"
}

// Receiving reports whether a QP in state s accepts packets from the wire
// (RTR and every later state but ERR).
func (s QPState) Receiving() bool { return s == RTR || s == RTS || s == SQD || s == SQE }

// Sending reports whether a QP in state s has its send queue armed (RTS,
// or drained/stopped by SQD/SQE).
func (s QPState) Sending() bool { return s == RTS || s == SQD || s == SQE }

// GID is a RoCEv2 GID: an IPv6 address, IPv4 ones IPv4-mapped
// (ibv_gid).
type GID [16]byte

// GIDFrom returns the GID of address a.
func GIDFrom(a netip.Addr) GID {
	if !a.IsValid() {
		return GID{}
	}
	return GID(a.As16())
}

// Addr is the address g names (IPv4-mapped GIDs as IPv4); the zero GID is
// the invalid address.
func (g GID) Addr() netip.Addr {
	if g == (GID{}) {
		return netip.Addr{}
	}
	return netip.AddrFrom16(g).Unmap()
}

func (g GID) String() string { return g.Addr().String() }

// AddressVector says where a QP's or a UD work request's packets go: the
// fields of ibv_ah_attr and its GRH that RoCEv2 uses.
type AddressVector struct {
	DGID      GID    // destination
	FlowLabel uint32 // IPv6 flow label; UDP source port entropy
	SGIDIndex uint8  // index into the device's GID table: the source address
	HopLimit  uint8  // TTL; 0 means 64
	// TrafficClass is the IPv4 TOS / IPv6 traffic class, as given.
	TrafficClass uint8
	SL           uint8 // service level (carried, not used on Ethernet)
	// DMAC is the next hop's Ethernet address; zero lets the device
	// resolve DGID (as the kernel resolves rdma_ah_attr's dmac for RoCE).
	DMAC [6]byte
	// UDPSrcPort, if not 0, is the UDP source port of the packets; 0
	// derives it from the flow label and QPNs as rdma_get_udp_sport does.
	UDPSrcPort uint16
}

// AH is an address handle as a UD send work request carries it to the
// device: where the datagram goes and the frame header the device
// prepends, prepared once when the AH was made. Transports pass it through
// without looking inside.
type AH struct {
	AV AddressVector
	// Header is the device's prepared Ethernet/IP/UDP header for AV.
	Header []byte
}

// QPCaps are a QP's queue sizes (ibv_qp_cap).
type QPCaps struct {
	MaxSendWR  uint32
	MaxRecvWR  uint32
	MaxSendSGE uint32
	MaxRecvSGE uint32
	MaxInline  uint32
}

// QPAttr are the attributes of a QP that a modify sets and a query
// reports: the fields of ibv_qp_attr that a RoCE QP uses. Which of them a
// modify applies is said by its QPAttrMask.
type QPAttr struct {
	State    QPState // IBV_QP_STATE: the state to move to
	CurState QPState // IBV_QP_CUR_STATE: the state the caller believes the QP is in
	// SQDrainNotify asks, with the move to SQD, for an SQ_DRAINED event
	// (IBV_QP_EN_SQD_ASYNC_NOTIFY).
	SQDrainNotify   bool
	PathMigState    uint8  // IBV_QP_PATH_MIG_STATE (only MIGRATED, 0, is meaningful here)
	PathMTU         uint32 // IBV_QP_PATH_MTU, in bytes: 256, 512, 1024, 2048 or 4096
	QKey            uint32 // IBV_QP_QKEY
	RQPSN           uint32 // IBV_QP_RQ_PSN
	SQPSN           uint32 // IBV_QP_SQ_PSN
	DestQPN         uint32 // IBV_QP_DEST_QPN
	Access          Access // IBV_QP_ACCESS_FLAGS: remote operations the QP serves
	PKeyIndex       uint16 // IBV_QP_PKEY_INDEX
	Port            uint8  // IBV_QP_PORT (1: softrnic devices have one port; 0 taken as 1)
	MaxRdAtomic     uint8  // IBV_QP_MAX_QP_RD_ATOMIC: READ/atomics outstanding as a requester
	MaxDestRdAtomic uint8  // IBV_QP_MAX_DEST_RD_ATOMIC: responder resources
	MinRNRTimer     uint8  // IBV_QP_MIN_RNR_TIMER: the code sent in our RNR NAKs
	Timeout         uint8  // IBV_QP_TIMEOUT: local ACK timeout 4.096 µs × 2^Timeout, 0 = infinite
	RetryCnt        uint8  // IBV_QP_RETRY_CNT
	RNRRetry        uint8  // IBV_QP_RNR_RETRY: 7 = infinite
	_               [3]byte
	AV              AddressVector // IBV_QP_AV
}

// QPAttrMask says which QPAttr fields a modify sets (ibv_qp_attr_mask),
// with the IBV_QP_* bit values.
type QPAttrMask uint32

// Attribute mask bits.
const (
	AttrState            QPAttrMask = 1 << 0
	AttrCurState         QPAttrMask = 1 << 1
	AttrEnSQDAsyncNotify QPAttrMask = 1 << 2
	AttrAccessFlags      QPAttrMask = 1 << 3
	AttrPKeyIndex        QPAttrMask = 1 << 4
	AttrPort             QPAttrMask = 1 << 5
	AttrQKey             QPAttrMask = 1 << 6
	AttrAV               QPAttrMask = 1 << 7
	AttrPathMTU          QPAttrMask = 1 << 8
	AttrTimeout          QPAttrMask = 1 << 9
	AttrRetryCnt         QPAttrMask = 1 << 10
	AttrRNRRetry         QPAttrMask = 1 << 11
	AttrRQPSN            QPAttrMask = 1 << 12
	AttrMaxQPRdAtomic    QPAttrMask = 1 << 13
	AttrAltPath          QPAttrMask = 1 << 14
	AttrMinRNRTimer      QPAttrMask = 1 << 15
	AttrSQPSN            QPAttrMask = 1 << 16
	AttrMaxDestRdAtomic  QPAttrMask = 1 << 17
	AttrPathMigState     QPAttrMask = 1 << 18
	AttrCap              QPAttrMask = 1 << 19
	AttrDestQPN          QPAttrMask = 1 << 20
	AttrRateLimit        QPAttrMask = 1 << 25
)

var attrNames = [...]string{0: "STATE", 1: "CUR_STATE", 2: "EN_SQD_ASYNC_NOTIFY", 3: "ACCESS_FLAGS", 4: "PKEY_INDEX",
	5: "PORT", 6: "QKEY", 7: "AV", 8: "PATH_MTU", 9: "TIMEOUT", 10: "RETRY_CNT", 11: "RNR_RETRY", 12: "RQ_PSN",
	13: "MAX_QP_RD_ATOMIC", 14: "ALT_PATH", 15: "MIN_RNR_TIMER", 16: "SQ_PSN", 17: "MAX_DEST_RD_ATOMIC",
	18: "PATH_MIG_STATE", 19: "CAP", 20: "DEST_QPN", 25: "RATE_LIMIT"}

// String names the bits of m as IBV_QP_* names, joined by "|".
func (m QPAttrMask) String() string {
	if m == 0 {
		return "0"
	}
	var b strings.Builder
	for i := 0; i < 32; i++ {
		if m&(1<<i) == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('|')
		}
		if i < len(attrNames) && attrNames[i] != "" {
			b.WriteString(attrNames[i])
		} else {
			b.WriteString("BIT_")
			b.WriteString(string(rune('0' + i/10)))
			b.WriteString(string(rune('0' + i%10)))
		}
	}
	return b.String()
}
