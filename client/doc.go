// Package client lets an application in another process use the RNIC of a
// running softrnic daemon, the way it would use a hardware one through
// verbs: a Client is a verbs.Device (and its objects verbs' PD, MR, CQ, SRQ,
// QP and AH), a verbs.AsyncEventer (Events: the asynchronous events of its
// own objects and of the daemon's port, DEVICE_FATAL when the daemon goes
// away), and an rdmacm.CM for connections through the daemon's CM.
//
// Control operations are messages on the daemon's Unix socket. The data path
// is shared memory: registered memory is a memfd the daemon maps too, so a
// remote RDMA READ or WRITE lands directly in the application's buffer; send
// and receive queues and completion queues are rings (internal/shmring) in
// memfds shared with the daemon, which its device's engine reads and
// writes directly, so PostSend, PostRecv and CQ.Poll are memory operations
// and make a syscall only to wake a daemon that has gone to sleep for lack
// of work. An application with nothing to do until a completion comes
// calls Client.Poll (verbs.Poller) when its CQs are empty: it sleeps until
// the daemon writes the next completion, leaving the CPU to the daemon's
// engine, which on a small host is the one that must run for it to come.
//
// Handles are per connection: nothing a client names can reach another
// client's objects. When the connection closes (Close, or the process dies)
// the daemon moves the client's QPs to error and frees everything it owned.
package client
