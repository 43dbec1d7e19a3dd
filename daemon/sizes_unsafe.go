package daemon

import (
	"unsafe"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// Sizes of the device's per-entry arrays and of the daemon's WR decode
// buffers, for queue memory.
var (
	wcBytes      = int64(unsafe.Sizeof(ib.WC{}))
	sendWQEBytes = int64(unsafe.Sizeof(ib.SendWQE{}))
	recvWQEBytes = int64(unsafe.Sizeof(ib.RecvWQE{}))
	segBytes     = int64(unsafe.Sizeof(ib.Seg{}))
	sendWRBytes  = int64(unsafe.Sizeof(verbs.SendWR{}))
	recvWRBytes  = int64(unsafe.Sizeof(verbs.RecvWR{}))
	sgeBytes     = int64(unsafe.Sizeof(ib.SGE{}))
)
