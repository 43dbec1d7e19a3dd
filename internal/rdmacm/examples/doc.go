// Package examples runs librdmacm's rdma_server and rdma_client examples
// over rdmacm.CM (an in-process agent or a daemon's), so that `softrnic rdma_server` and `softrnic
// rdma_client` interoperate with the stock ones on rxe or a ConnectX: the
// client connects (rdma_connect with default parameters), SENDs a 16-byte
// message and waits for the server's 16-byte answer; the server takes one
// request, receives the message, answers it and disconnects.
package examples
