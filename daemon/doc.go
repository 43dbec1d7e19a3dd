// Package daemon is the per-host softrnic daemon: one RNIC on one Ethernet
// interface, shared by local applications in other processes the way a
// hardware RNIC is shared through its kernel driver.
//
// # Pieces
//
//   - Config (config.go): one key = value file format, every key also a
//     flag, errors naming the key; NewLogger sets up log/slog.
//   - The engine loop of a rnic.Device on a port.Port is engine's (a Loop
//     with the capture tap of internal/capture on both directions). With
//     AF_XDP the port is an afxdp.Multi: one socket per RX queue (queues =
//     0: all of them), all drained by that one engine goroutine, each QP
//     transmitting on the queue of its UDP source port. One goroutine per
//     device, not per queue: the device's step functions never run
//     concurrently.
//   - Server (server.go, session.go): the control socket and the ring pump,
//     serving one rnic.Device. A session holds the device's own objects
//     (*rnic.PD, *rnic.MR, *rnic.CQ, *rnic.QP, *rnic.SRQ, *rnic.AH),
//     asserted once when created, so the pump's data path makes no
//     interface calls. SRQs (srq.go) are rings the pump drains as it
//     drains RQs.
//   - Asynchronous events (async.go): one goroutine takes the device's
//     events (a subscription of its own, beside the rdma_cm agent's),
//     hands each to the session owning the QP, CQ or SRQ it names (port
//     events to all), adds the daemon's own, and writes each session's
//     event socket without blocking (proto/async.go).
//   - rdma_cm (ucm.go): the device's CM agent runs the CM exchange on the
//     GSI QP through its event interface (rdmacm.EventCM) and reports the
//     peer's doings as events on the clients' event channels; each client
//     (librdmacm.so.1, package client) drives its own QPs, as librdmacm
//     drives an application's over the kernel. No operation waits for the
//     peer. ACCEPT names the client's RC QP, a SIDR answer its UD QP in
//     RTS with the Q_Key it announces.
//   - Counters (counters.go, stats.go, metrics.go): the one table from what
//     the device, its QPs, the engine loop and the port count to the names
//     of rxe and mlx5 (proto.DeviceCounters, proto.QPCounters); OpStats
//     (softrnic stats) and the Prometheus collector serve snapshots of it.
//
// # Control path
//
// Clients connect to a SOCK_SEQPACKET Unix socket whose file mode and group
// are the first gate; SO_PEERCRED (root, the daemon's user, or a member of
// the configured group, supplementary groups included) is the second. Each
// connection is a session with its own handle space: a handle names an
// object of that connection only, so no client can name another's PD, MR,
// CQ, QP or AH. Messages are fixed-size binary structs (package daemon/proto);
// memory and rings travel as memfds, wakeups as eventfds (SCM_RIGHTS).
//
// # Metrics endpoint
//
// metrics = host:port serves Prometheus /metrics: every QP number, its state
// and counters, which map the host's connections and show its traffic. So
// it is safe by default: a loopback address (127.0.0.1, [::1], localhost)
// serves anyone on the host, and any other address (":9464" and
// "0.0.0.0:9464" included) is refused, naming the key, unless the operator
// also sets one of
//
//   - metrics-token-file = PATH: a bearer token (at least 16 printable
//     characters, e.g. openssl rand -hex 16; the file not accessible by
//     others) that every scrape must send as "Authorization: Bearer
//     TOKEN" (Prometheus: authorization { credentials_file: ... }), on
//     loopback too. Digests of the sent and the expected token are compared
//     in constant time; a missing or wrong token gets 401. It is read at
//     start: restart the daemon to change it.
//   - metrics-allow-public = true: no token; the network in front of the
//     address is trusted (a firewall, a management VLAN).
//
// The endpoint itself (ServeMetrics) checks the address it bound, so a host
// name that resolves beyond loopback is refused as well.
//
// # Data path
//
// Registered memory is either the client's own memfd, sealed against
// shrinking (checked before mapping, so a client cannot fault the daemon by
// truncating it) and mapped by the daemon: remote READ and WRITE land in the
// client's buffer with no copy (the Go clients); or any range of the
// client's address space, which the daemon never maps: the client passes
// its /proc/self/mem and /proc/self/maps once (ATTACH_MEM), the device
// copies through the first in batches (rnic.AddrSpace), and each
// registration is checked against the second (procmem.go; the stock
// applications of the C library). SQ, RQ and CQ are shmring rings in memfds
// the daemon creates and seals. The pump (one goroutine) takes WRs from
// every SQ and RQ, checks them (a malformed entry completes in error and
// errors the QP), posts them to the device, and moves the device's
// completions into the clients' CQ rings, only as many as fit. A UD WR
// names one of the session's address handles (CREATE_AH resolved the next
// hop on the control path), never a raw destination. It spins
// while there is work and then sleeps on an eventfd that clients ring only
// when it sleeps; a client sleeping on its CQ is rung the same way (one
// that armed it for solicited completions only, for a receive with SE or a
// completion in error). Posting and polling are therefore memory
// operations in the common case.
//
// # Lifetimes
//
// A client that goes away (Close, exit, SIGKILL) has its QPs moved to error
// and destroyed, its SRQs destroyed, its MRs deregistered, its AHs, CQs and
// PDs freed, its event socket closed, its listeners closed, its connection
// requests and half-open connections refused (REJ) and its established ones
// disconnected (DREQ). A deregistered MR's mapping is replaced in place by
// anonymous memory at once and unmapped only when the session has no QP and
// no SRQ left, so work or a responder
// that resolved the MR an instant before can neither reach the client's
// pages nor fault the daemon. Server.Close (SIGTERM) stops the pump, moves
// every QP to error, drains rings and CQs so clients poll flush
// completions, tells every rdma_cm ID DEVICE_REMOVAL, then closes every
// session.
package daemon
