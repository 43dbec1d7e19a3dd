package afxdp

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ifreqData is struct ifreq with its union holding a pointer.
type ifreqData struct {
	Name [unix.IFNAMSIZ]byte
	Data unsafe.Pointer
	_    [16]byte
}

func ethtoolRxQueues(name string) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	ch := ethtoolChannels{Cmd: unix.ETHTOOL_GCHANNELS}
	var ifr ifreqData
	copy(ifr.Name[:unix.IFNAMSIZ-1], name)
	ifr.Data = unsafe.Pointer(&ch)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return 0, e
	}
	return int(ch.RxCount + ch.CombinedCount), nil
}
