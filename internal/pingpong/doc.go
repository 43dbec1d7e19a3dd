// Package pingpong is rdma-core's ibv_rc_pingpong and ibv_ud_pingpong on
// softrnic: the same TCP side channel (one 52-byte "LID:QPN:PSN:GID"
// record each way, then the client's "done"), the same buffer layout, the
// same ping-pong of one SEND each way per iteration with rx-depth receives
// posted, the same --chk data pattern and the same report lines, so that
// either end may be the stock tool on an rxe or ConnectX host.
package pingpong
