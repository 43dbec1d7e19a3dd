// Package rdmacm is rdma_cm on an RNIC: the CM interface (cm.go) that
// applications connect QPs through, and the Agent that implements it on a
// device of this process, as the kernel's rdma_cm does for an RNIC: it owns
// the device's GSI QP (QP1), keeps receives posted on it, feeds every MAD
// to a cm.Manager, sends the Manager's MADs as UD SENDs to QP1 of the peer,
// and acts on the Manager's events by moving the application's QPs through
// their states. Package client implements CM through a softrnic daemon's
// Agent. The Agent speaks only package verbs to its device.
//
// The Agent also serves an event interface (EventCM, events.go): the CM
// exchange without the QP, whose owner drives its QPs itself from the
// events, as librdmacm does over the kernel. The daemon serves its
// clients' rdma_cm through it.
//
// Service IDs are rdma_cm's TCP port space (0x0000000001060000 | port) and
// REQs carry the rdma_cm IP header, so a stock rping or `ib_write_bw -R` on
// rxe or a ConnectX is the peer.
//
// # Goroutines and locking
//
// One goroutine per Agent polls the GSI CQ, reads the device's
// asynchronous events (COMM_EST tells a passive side whose RTU was lost
// that the connection is up) and runs the Manager's timers. The Manager is
// not safe for concurrent use: the agent's goroutine and the API calls
// (Connect, Accept, Disconnect, from any goroutine) take one mutex around
// it.
// Address resolution (ARP, which may take a while) is never done under that
// mutex: a peer's MAC is resolved before its first MAD is handed to the
// Manager or before a Connect's REQ is sent, and cached.
//
// The Agent consumes the device's Events channel (verbs.AsyncEventer):
// nothing else should read it while an Agent runs.
//
// # Choices and limits
//
//   - The passive side programs its QP with the smaller of the REQ's path
//     MTU and the port's (rxe instead refuses a REQ whose MTU its netdev
//     cannot carry).
//   - A REQ waits in its listener's backlog until Accept takes it. One
//     queued behind others gets an MRA (service timeout ≈ 69 s) so that
//     the active side stops retrying meanwhile; one at the head of the
//     backlog gets none, and an application slower than the active side's
//     retries (about 100 s with the kernel's defaults) sees it expire
//     (ErrRequestExpired).
//   - RC through REQ/REP/RTU (RDMA_PS_TCP: Listen, Connect) and UD through
//     SIDR (RDMA_PS_UDP: ListenUD, ResolveUD, PrepareUD, Q_Key
//     RDMA_UDP_QKEY; ud.go). A listener is not bound to one of the
//     device's addresses (it takes requests for any of them).
//   - As librdmacm, the CM drives QPs the application created (in its
//     PD, on the agent's device: a QP of another device is refused), and
//     never destroys one: closing a connection leaves its QP to the
//     application.
//   - Packages internal/rdmacm/rping and internal/rdmacm/examples run
//     librdmacm's rping, rdma_server and rdma_client on any CM.
//
// # Interop
//
// The lab (lab/interop) runs `softrnic rping` against the stock rping of
// the kernel's rxe, each side as client and as server, over IPv4 and IPv6
// GIDs, at path MTU 1024 and 4096 and up to rping's largest buffer
// (65535 bytes), with -V. The QP PSNs are cm.QPAttr's, which follow the
// Linux CM's reading of the Starting PSN fields (each side sends from the
// peer's REQ/REP): the first lab run showed that the other reading
// connects but drops every packet.
package rdmacm
