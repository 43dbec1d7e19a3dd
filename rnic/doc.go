// Package rnic is softrnic's RNIC: protection domains, memory regions,
// completion queues, shared receive queues, address handles and RC, UC, UD
// and GSI (QP1) queue pairs with the InfiniBand QP state machine, driving
// the transports of package transport (transport/rc, transport/ud), and
// the step functions an engine calls to move RoCEv2 frames in and out.
//
// One file per role, as the kernel's rxe splits its driver:
//
//	device.go    the device and its configuration (Config, NewDevice)
//	pd.go mr.go  protection domains; memory regions and their keys
//	cq.go srq.go completion queues; shared receive queues
//	av.go        address vectors and handles (resolution of the next hop)
//	qp.go        the QP object: creation, reset, destroy, publishing work
//	modify.go    ibv_modify_qp: IBA's transitions and attribute checks
//	post.go      post send and post receive: work requests to WQEs
//	recv.go      receive checks and demultiplexing to a QP's transport
//	loop.go      loopback: frames for the device itself, received without the wire
//	dma.go       memory of another address space: batched copies, faults
//	net.go       the only code that knows Ethernet, IP and UDP (frame's templates)
//	sched.go     the ready and timer lists: Transmit, Expire, NextDeadline
//	poll.go      busy polling: an application running the step itself
//	queues.go    work queues outside the device (the daemon's client rings)
//	cc.go        congestion control: the device's profile, per-QP config
//	events.go    asynchronous events
//	counters.go  device and per-QP counters
//	table.go     the lock-free key and QPN tables of the data path
//
// # Concurrency contract
//
// Two kinds of goroutine use a Device:
//
//   - Applications (any number, any goroutine) use the control path
//     (AllocPD, RegMR, CreateCQ, CreateQP, Modify, Destroy) and the data
//     path verbs PostSend, PostRecv, SRQ.PostRecv, CQ.Poll and CQ.Wait.
//     All of them are safe for concurrent use.
//   - One engine goroutine per Device calls the step functions Receive,
//     Transmit, NextDeadline and Expire, never concurrently with each
//     other, and waits on Doorbell for new work when it has nothing else
//     to do (an application's Poll runs them in its own goroutine while
//     the engine naps, under the same exclusion).
//
// Each QP has one mutex, taken by a post (once per PostSend/PostRecv call,
// whatever the number of WRs) and by the engine once per run of
// consecutive frames for the same QP in a Receive batch, once per QP in a
// Transmit call and once per expired QP: never per packet in steady
// state. Completions reach a CQ once per QP per step (one CQ lock per
// batch). The QP and key tables the engine reads per packet are read
// without a lock (table.go). A QP that gets work (frames to send, a timer)
// is handed to the engine's ready or timer list once, under a short device
// lock, and leaves it when the work is done: the step functions visit only
// busy QPs. An SRQ, being shared, is locked once per message that takes
// one of its receive WQEs. Lock order: QP, then CQ or SRQ. Asynchronous
// events (Events: COMM_EST, QP_FATAL, SRQ_LIMIT_REACHED, PORT_ERR, …) go
// through buffered channels (Events, and each Subscribe's) that never
// block the engine; what a full one drops is counted (LostEvents).
//
// # Virtual time
//
// The step functions take now and never read a clock, so a test or the
// simulator drives devices and port/memlink in virtual time from one
// goroutine (see the example), and every run with a seed is identical.
//
// # Security
//
// lkeys and rkeys are 32 random bits from crypto/rand, never a counter.
// Every remote access is checked against the rkey's MR: same PD as the QP,
// valid (not invalidated or deregistered), access flags, bounds without
// overflow. Received frames are checked for destination address (one of
// the device's), BTH version, P_Key, destination QP and its type and state,
// source address of the connected peer (RC/UC), Q_Key (UD) and ICRC before
// a transport sees them; nothing a peer sends can make the device panic or
// touch memory outside an MR.
package rnic
