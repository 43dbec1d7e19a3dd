// Package rping is the application protocol of librdmacm's rping example,
// as pure state machines, so that `softrnic rping` interoperates with the
// stock tool: after the rdma_cm connection (package cm), the client
// advertises buffers with 16-byte SENDs and the server moves the data with
// RDMA READ and RDMA WRITE:
//
//	client: SEND {start buf, rkey, size}     server: RDMA READ the start buf
//	                                          server: SEND "go ahead"
//	client: SEND {sink buf, rkey, size}      server: RDMA WRITE the data back
//	                                          server: SEND "go ahead"
//	client: compare sink with start (-V), next ping
//
// The machines say what to post (Action) and take completions; buffers,
// MRs and the QP belong to the caller.
package rping
