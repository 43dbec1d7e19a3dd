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
//   - Server (server.go, session.go): the control socket, serving one
//     rnic.Device. A session holds the device's own objects (*rnic.PD,
//     *rnic.MR, *rnic.CQ, *rnic.QP, *rnic.SRQ, *rnic.AH), asserted once
//     when created, so the data path makes no interface calls.
//   - The data path (rings.go): the clients' rings as the device's work
//     queues (SQs, RQs and SRQs, srq.go) and CQ stores.
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
//   - Limits (limits.go, mappings.go): what every connection, uid and the
//     host hold of the daemon, against the configured limits; the
//     mappings of clients' memfds that their MRs share.
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
// # Hostile clients
//
// Any local program of the control group may be hostile: none may take
// the daemon down or starve the others. Serve never stops before Close:
// a failed accept is counted (accept_errors) and retried after a pause,
// and when the daemon is out of file descriptors the newest connection is
// accepted with an fd kept in reserve, told EMFILE and closed
// (shed_connections). A refused peer, or one whose uid is at its
// connection limit, gets its OPEN's answer at once and is closed
// (rejected_connections); a peer silent past OpenTimeout (1 s) is closed.
//
// Every connection, every uid (its connections together) and the host
// are limited in connections, file descriptors, mappings, QPs, CQs, MRs,
// mapped client memory and queue memory (rings, which are the CQs'
// stores, the device's send and receive arrays and the daemon's WR decode
// buffers: WRs × slot and SGEs), set in [limits] as
// RESOURCE-per-SCOPE; PDs, SRQs, AHs, address spaces and rdma_cm
// objects together per connection. The defaults are sized when the daemon starts from its
// RLIMIT_NOFILE (raised to the hard limit: the unit's LimitNOFILE),
// vm.max_map_count less what the daemon keeps for itself (so that the
// in-place replacement of a detach never meets the kernel's limit) and
// memory; contrib/softrnic.conf.example lists them. A request over a limit
// fails as the kernel fails the like (ENOMEM for objects and memory,
// EMFILE per connection or uid and ENFILE per host for file descriptors,
// EAGAIN for connections), is counted (limit_refusals; per resource and
// scope on /metrics) and is logged once per client and limit. A uid's
// limits are its clients' together: clients of other uids never notice.
// MRs in one memfd share the session's mapping of a 64 MiB window of it,
// so that 100 000 MRs cost a few mappings. An MR by address (ATTACH_MEM,
// REG_MR_ADDR) costs an MR and its bytes but no mapping; its address
// space costs two fds (the client's mem and maps files). Memory a client held is given
// back when it goes (its queues' Go memory returned to the system at
// once when it was large).
//
// Controlled Q_Keys (the high bit set) need CAP_NET_RAW in the daemon's
// user namespace, as ib_uverbs has them (EPERM, controlled_qkey_refused).
//
// What is not bounded: a uid's clients share its limits, so one of them
// can starve the others of the same uid (root's clients are one uid);
// the credentials and capabilities are the connecting process's (as
// SO_PEERCRED's), read once, so a connection passed to another process
// keeps them; queue memory is computed from the caps (rings exactly, the
// device's arrays from their element sizes), not measured; a flood of
// connections fills the listen queue and a client's connect then waits
// (client.Dial, up to 5 s) or fails; SRQs count only as objects of
// their connection, not yet in queue memory, fds or mappings, and the
// event sockets not in fds; a mapping that cannot be detached (the
// kernel out of memory) stays mapped, its MRs unreachable, until the
// session's QPs are gone.
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
// applications of the C library). SQ, RQ and CQ are shmring rings in
// memfds the daemon creates and seals, and they are the device's own
// queues, as a hardware RNIC's are in host memory: the engine goroutine
// that drives the device fetches from every SQ, RQ and SRQ at each step (a
// post is a memory write the engine finds while it runs; rnic.Queues), and
// a message that finds its RQ empty takes what waits in the RQ ring at
// once (rnic.QP.SetRecvRefill). Each WR is checked before it reaches the
// device: one that does not decode or fails the device's checks, which
// ibv_post_send or ibv_post_recv would have refused, is a bad WQE, posted
// in error in its place (rnic.QP.PostSendInError, PostRecvInError). A
// send completes in error after the WRs before it and stops the QP, SQE
// for a UC or UD send queue and ERR for RC; a receive completes in error
// after the receives before it were flushed, the QP in ERR whatever its
// type (IBA 10.3.1); the WRs after either are flushed, and both are
// counted in bad_wqes. A malformed SRQ entry retires the SRQ. The device
// writes each completion into the client's CQ ring where it produces it
// (rnic.CQSink), and the CQ overruns when the client lets its ring fill
// (cq_ring_dropped counts the completions lost). A UD WR names one of the
// session's address handles (CREATE_AH resolved the next hop on the
// control path), never a raw destination.
//
// Who waits how: the engine spins while traffic flows (its adaptive
// window), then arms every ring's wakeup flag and sleeps in its port until
// a frame, a timer or a wake-up; a post that finds its ring armed writes
// the client's eventfd, which the waker goroutine turns into Device.Wake.
// A client polls its CQ rings; one with nothing else to do sleeps in
// client.Client.Poll, or on a completion channel, which arms its CQ rings,
// and the device writes the CQ's eventfd with the next completion (one
// armed for solicited completions only: with the next receive with SE or a
// completion in error). Posting and polling are therefore memory
// operations while both sides run, and a side pays a syscall only to wake
// the other.
//
// # Lifetimes
//
// A client that goes away (Close, exit, SIGKILL) has its QPs moved to error
// and destroyed, its SRQs destroyed, its MRs deregistered, its AHs, CQs and
// PDs freed, its event socket closed, its listeners closed, its connection
// requests and half-open connections refused (REJ) and its established ones
// disconnected (DREQ). A mapping whose last MR was deregistered is replaced
// in place by anonymous memory at once and unmapped only when the session
// has no QP and no SRQ left, so work or a responder
// that resolved the MR an instant before can neither reach the client's
// pages nor fault the daemon. A destroyed CQ lets go of its ring before
// the ring is unmapped (rnic.CQ.Destroy). Server.Close (SIGTERM) moves
// every QP to error, lets the engine drain the rings so that clients poll
// flush completions, detaches the rings from the device, tells every
// rdma_cm ID DEVICE_REMOVAL, then closes every session.
package daemon
