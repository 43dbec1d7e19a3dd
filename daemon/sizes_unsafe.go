package daemon

import (
	"unsafe"

	"github.com/softrnic/softrnic/ib"
)

// Sizes of the device's per-entry arrays, for queue memory.
var (
	wcBytes      = int64(unsafe.Sizeof(ib.WC{}))
	sendWQEBytes = int64(unsafe.Sizeof(ib.SendWQE{}))
	recvWQEBytes = int64(unsafe.Sizeof(ib.RecvWQE{}))
	segBytes     = int64(unsafe.Sizeof(ib.Seg{}))
)
