package proto

import "github.com/softrnic/softrnic/ib"

// UCM: rdma_cm for clients, event-based, as the kernel's rdma_ucm serves
// rdma-core's librdmacm. It is what softrnic's librdmacm.so.1 and the Go
// client (package client) speak; daemon/ucm.go serves it.
//
// # Who does what
//
// The daemon runs the CM exchange on its GSI QP (REQ, REP, RTU, REJ, MRA,
// DREQ, DREP; SIDR_REQ, SIDR_REP) and reports its outcome; the client
// drives its own QP. A connection names a QP the client created itself (by
// QPN), and the client moves it through INIT, RTR and RTS with OpModifyQP,
// using the attributes the events carry (rdma_init_qp_attr), as librdmacm
// drives the QPs of applications with the attributes the kernel's CM
// negotiated. The daemon never modifies a client's QP for the CM; it only
// checks that a QPN a client names is one of that client's QPs, of the
// port space's type (RC for PortSpaceTCP, in RTR at least when it
// accepts; UD for PortSpaceUDP, and then in RTS with the Q_Key the client
// answers with), so that no client can make a peer address another
// client's QP, or one not ready for the peer's packets.
//
// # No call waits for the peer
//
// Every UCM operation is answered at once, on the control connection, when
// the daemon has done its part: LISTEN when listening, CONNECT when the REQ
// (or SIDR_REQ) is sent, ACCEPT when the REP (or SIDR_REP) is sent,
// DISCONNECT when the DREQ is sent. What the peer does comes later as an
// event, so request/reply pairing on the control connection is never held
// up and one connection serves any number of connection attempts.
//
// # Event channels
//
// Events travel on event channels, not on the control connection: a
// reply follows its request there, and an unsolicited message would break
// that pairing (or need a reader thread in every client to demultiplex).
// OpUCMCreateChannel creates one and hands the client one end of a
// SOCK_SEQPACKET socket pair; the daemon keeps the other and writes each
// event as one message, an OpUCMEvent Header (Seq counting the channel's
// events from 1) followed by a UCMEvent. Each ID belongs to one channel
// (OpUCMMigrate moves it; events written before the reply stay on the old
// one). A channel per rdma_event_channel, rather than one stream per
// session, lets the socket buffer be the channel's event queue: the
// client's end is readable exactly while events wait, a non-blocking
// client gets EAGAIN, and it reads end-of-file when the daemon is gone
// (rdma_cm's DEVICE_REMOVAL), with no thread in the library to route
// events. A shared-memory ring would buy nothing here: events are a few per
// connection, and a ring would add a wakeup protocol and index checks.
//
// The daemon never blocks on a channel: it writes with MSG_DONTWAIT and
// keeps what does not fit in order in memory, bounded by what the session
// may hold (each ID has a few events at most in flight, each listener at
// most its backlog of CONNECT_REQUESTs).
//
// # IDs
//
// IDs name listeners and connections (and SIDR lookups) in the session's
// handle space: LISTEN and CONNECT create one, and the daemon creates one
// for every connection request, named by the CONNECT_REQUEST event. A
// client that does not want a request rejects it or destroys its ID.
// OpUCMDestroyID ends what the ID holds: a listener stops (the requests it
// handed out are IDs of their own, as the kernel's), a connection being
// set up is rejected, an established one gets a DREQ. Events of a
// destroyed ID that are already in the channel are the client's to drop.
//
// Which listener takes a request follows the kernel's rdma_cm: one bound
// to the request's destination address before a wildcard, an IPv6
// wildcard without AFOnly for IPv4 too; two listeners that could take
// the same request cannot both exist (EADDRINUSE). None: the daemon
// answers as the kernel does, REJ reason 8 (invalid service ID) or SIDR
// status 1 (unsupported). A listener whose backlog is full refuses with
// REJ reason 3 (no resources) or SIDR status 2 (reject).
//
// DISCONNECT of an established connection sends a DREQ; of one whose peer
// disconnected first it does nothing (DISCONNECTED was reported); of one
// not yet established it refuses it (REJ), as rdma_disconnect leaves such
// a connection unusable. TIMEWAIT_EXIT comes only after DISCONNECTED, as
// the kernel reports it.
//
// When the session ends (the client closes the connection, exits or is
// killed), the daemon does the same for every ID and closes its channels.
//
// # PSNs
//
// The Starting PSN of a REQ or REP is the PSN its sender expects to
// receive first, as the Linux CM reads it (see package cm, QPAttr): the
// client chooses its QP's receive PSN and sends it as
// UCMConnParam.StartingPSN; the event's UCMConnParam.StartingPSN is the
// peer's, the first PSN the client's QP sends.
//
// # Events
//
//	CONNECT_REQUEST   passive: a REQ or SIDR_REQ for a listener; ID is a new
//	                  ID, Listener the listener; Param is the REQ's (the
//	                  peer's QPN and Starting PSN; depths from our side),
//	                  PrivateData the user's part after the rdma_cm header
//	CONNECT_RESPONSE  active: the REP; move the QP to RTR and RTS, then
//	                  ESTABLISH (or REJECT it)
//	ESTABLISHED       passive: the RTU (or the QP's first packet, NOTIFY);
//	                  active UDP space: the SIDR_REP (QKey, Param.QPN)
//	REJECTED          the peer's REJ; Status is its reason
//	UNREACHABLE       Status -ETIMEDOUT: no answer to our REQ, REP or
//	                  SIDR_REQ (the CM's response timeout and retries);
//	                  -EHOSTUNREACH: the peer's address did not resolve;
//	                  after a SIDR_REP that refused, its SIDR status
//	DISCONNECTED      the peer's DREQ (a DREP was sent), or the DREP to
//	                  ours; Status -ETIMEDOUT if our DREQ went unanswered
//	TIMEWAIT_EXIT     the connection's time wait is over: the QP may be
//	                  reused
//	DEVICE_REMOVAL    the daemon is stopping; the channel closes next

// UCM operations, numbered apart from the others so that additions to
// either list cannot collide.
const (
	OpUCMCreateChannel  Op = 0x40 + iota // → HandleMsg (the channel); reply fd: the client's end of its event socket
	OpUCMDestroyChannel                  // HandleMsg (channel): the IDs still on it are destroyed with it
	OpUCMListen                          // UCMListenReq → HandleMsg (the listener's ID)
	OpUCMConnect                         // UCMConnectReq → HandleMsg (the connection's ID), once the REQ or SIDR_REQ is sent
	OpUCMAccept                          // UCMAcceptReq, once the REP or SIDR_REP is sent
	OpUCMReject                          // UCMRejectReq: a request (REJ, or SIDR_REP with status REJECT), or the REP of CONNECT_RESPONSE
	OpUCMEstablish                       // HandleMsg (ID): send the RTU of a CONNECT_RESPONSE (the client's QP is in RTS)
	OpUCMNotify                          // HandleMsg (ID): the client's QP got a packet before the RTU (IBV_EVENT_COMM_EST)
	OpUCMDisconnect                      // HandleMsg (ID): DREQ (or nothing, if the peer's DREQ came first); DISCONNECTED follows
	OpUCMMigrate                         // UCMMigrateReq: the ID's next events go to another channel
	OpUCMDestroyID                       // HandleMsg (ID)
	OpUCMEvent                           // never a request: the header of each message on an event channel
)

// UCMMaxPrivateData is the largest private data any UCM message carries
// (a REP's).
const UCMMaxPrivateData = 196

// Private data limits of rdma_cm, per message (the user's part: in REQ and
// SIDR_REQ after the 36-byte rdma_cm header).
const (
	UCMConnectPrivateData   = 56  // CONNECT, TCP space (REQ)
	UCMResolvePrivateData   = 180 // CONNECT, UDP space (SIDR_REQ)
	UCMAcceptPrivateData    = 196 // ACCEPT, TCP space (REP)
	UCMAcceptUDPrivateData  = 136 // ACCEPT, UDP space (SIDR_REP)
	UCMRejectPrivateData    = 148 // REJECT (REJ)
	UCMRejectUDPPrivateData = 136 // REJECT, UDP space (SIDR_REP)
)

// UCMEventType is an event's type, numbered as librdmacm's enum
// rdma_cm_event_type.
type UCMEventType uint32

// Event types (those the daemon sends; the others are the library's).
const (
	UCMEventConnectRequest  UCMEventType = 4
	UCMEventConnectResponse UCMEventType = 5
	UCMEventUnreachable     UCMEventType = 7
	UCMEventRejected        UCMEventType = 8
	UCMEventEstablished     UCMEventType = 9
	UCMEventDisconnected    UCMEventType = 10
	UCMEventDeviceRemoval   UCMEventType = 11
	UCMEventTimewaitExit    UCMEventType = 15
)

// CM REJ reasons a client gives in UCMRejectReq, as rdma_reject and
// rdma_reject_ece do.
const (
	UCMRejectConsumerDefined          uint16 = 28
	UCMRejectVendorOptionNotSupported uint16 = 35
)

// UCMConnParam is rdma_conn_param on the wire. In requests it is the
// client's: QPN its QP, StartingPSN the first PSN that QP expects,
// ResponderResources the READs and atomics it accepts at once,
// InitiatorDepth those it will have outstanding. In events it is the
// peer's, from our side: QPN and StartingPSN the peer's (the first PSN we
// send), ResponderResources what we must accept (the peer's initiator
// depth), InitiatorDepth what we may issue.
type UCMConnParam struct {
	QPN                uint32
	StartingPSN        uint32
	ResponderResources uint8
	InitiatorDepth     uint8
	FlowControl        uint8
	RetryCount         uint8 // at most 7
	RNRRetryCount      uint8 // at most 7 (7: retry forever)
	SRQ                uint8
	PrivateDataLen     uint8
	_                  uint8
	PrivateData        [UCMMaxPrivateData]byte
}

// UCMListenReq is the body of OpUCMListen. Which requests reach the
// listener follows the kernel's rdma_cm: an IPv4 listener takes IPv4
// requests, an IPv6 one IPv6 requests and, unless AFOnly
// (RDMA_OPTION_ID_AFONLY), IPv4 ones too (by the rdma_cm header's IP
// version).
type UCMListenReq struct {
	Channel   Handle
	Port      uint16
	Space     uint16   // PortSpaceTCP or PortSpaceUDP
	Backlog   uint32   // requests not yet accepted or rejected (0: 1024, at most 1024); more are refused
	Addr      [16]byte // the GID the listener is bound to (IPv4-mapped for IPv4); all zero: any of the device's
	IPVersion uint8    // 4 or 6: the family of the listener's address
	AFOnly    uint8    // an IPv6 listener takes no IPv4 requests
	_         [2]byte
}

// UCMConnectReq is the body of OpUCMConnect: a REQ (PortSpaceTCP) or a
// SIDR_REQ (PortSpaceUDP, Param.QPN and StartingPSN unused) to DstPort at
// Peer, from Local (one of the device's GIDs) with the rdma_cm header
// naming SrcPort.
type UCMConnectReq struct {
	Channel      Handle
	Space        uint16
	SrcPort      uint16
	DstPort      uint16
	QPType       ib.QPType // TCP space: RC, the type of Param.QPN's QP (UC: EOPNOTSUPP)
	PathMTU      uint8     // IB enum (1 = 256 … 5 = 4096): at most the port's active MTU
	HopLimit     uint8
	TrafficClass uint8
	_            [2]byte
	FlowLabel    uint32
	Local        [16]byte
	Peer         [16]byte
	Param        UCMConnParam
}

// UCMAcceptReq is the body of OpUCMAccept: a REP for a CONNECT_REQUEST of
// the TCP space (the client's QP is in RTR at least: the peer may send as
// soon as it has the REP), or a SIDR_REP with QKey for one of the UDP
// space (Param.QPN a UD QP in RTS with that Q_Key; StartingPSN unused).
type UCMAcceptReq struct {
	ID    Handle
	QKey  uint32
	Param UCMConnParam
}

// UCMRejectReq is the body of OpUCMReject: a REJ with Reason (a
// CONNECT_REQUEST, or the REP of a CONNECT_RESPONSE), or for a request of
// the UDP space a SIDR_REP with status REJECT.
type UCMRejectReq struct {
	ID             Handle
	Reason         uint16
	PrivateDataLen uint8
	_              uint8
	PrivateData    [UCMRejectPrivateData]byte
}

// UCMMigrateReq is the body of OpUCMMigrate.
type UCMMigrateReq struct {
	ID      Handle
	Channel Handle
}

// UCMEvent follows an OpUCMEvent header on an event channel.
type UCMEvent struct {
	Event     UCMEventType
	Status    int32    // 0; -errno; REJECTED: the REJ reason; UNREACHABLE after a SIDR_REP: its status
	ID        Handle   // the ID the event is for (CONNECT_REQUEST: the new one)
	Listener  Handle   // CONNECT_REQUEST: the listener
	Local     [16]byte // our GID of the connection (IPv4-mapped for IPv4)
	Peer      [16]byte // the peer's GID
	LocalPort uint16   // CONNECT_REQUEST: the listened port
	PeerPort  uint16   // CONNECT_REQUEST: the requester's port (rdma_cm header)
	QKey      uint32   // ESTABLISHED in the UDP space: the Q_Key to send to Param.QPN with
	// The path the CM negotiated (CONNECT_REQUEST, CONNECT_RESPONSE).
	PathMTU      uint8 // IB enum
	ACKTimeout   uint8 // local ACK timeout for RTS (4.096 µs · 2^t)
	HopLimit     uint8
	TrafficClass uint8
	FlowLabel    uint32
	PKey         uint16
	_            [6]byte
	Param        UCMConnParam
}
