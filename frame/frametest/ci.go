package frametest

import (
	"time"

	"github.com/gopacket/gopacket"
)

func captureInfo(n int) gopacket.CaptureInfo {
	return gopacket.CaptureInfo{Timestamp: time.Unix(1700000000, 0), CaptureLength: n, Length: n}
}
