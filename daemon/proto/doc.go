// Package proto is the contract between the softrnic daemon and its local
// clients: the control messages exchanged over the daemon's Unix socket, and
// the layout of the work queue and completion queue entries in the
// shared-memory rings (internal/shmring) through which data-path operations
// flow without syscalls.
//
// Control messages travel on a SOCK_SEQPACKET socket, so each message is one
// record and file descriptors (memfds, eventfds) ride with the message that
// names them (SCM_RIGHTS). A message is a 16-byte Header followed by a body,
// a fixed-size little-endian struct per operation (encoding/binary), whose
// exact size is checked: a body of the wrong size is refused, never guessed
// at. Error replies carry an errno in Header.Errno and a short text body.
package proto
