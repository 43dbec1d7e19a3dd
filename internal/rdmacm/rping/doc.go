// Package rping runs librdmacm's rping example over an rdmacm.Agent: the
// connection through the CM on QP1 (port 7174 by default), then rping's
// protocol (package cm/rping) on the RC QP, so that `softrnic rping` and
// a stock rping on rxe or a ConnectX talk to each other. The client
// advertises its start buffer, the server RDMA READs it, the client
// advertises its sink buffer, the server RDMA WRITEs the data back; with
// Validate the client compares the two, as `rping -V` does.
//
// It runs on any RNIC through verbs and rdmacm.CM only: in process (an
// rdmacm.Agent on the tool's own device) or through a softrnic daemon (a
// client.Client, whose daemon's CM agent drives the QP the tool made
// there), as librdmacm's rping runs on any RNIC.
package rping
