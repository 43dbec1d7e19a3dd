package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// XSKStats are the kernel's statistics of a process's AF_XDP sockets
// (getsockopt XDP_STATISTICS), summed over its sockets.
type XSKStats struct {
	Sockets int `json:"sockets"` // AF_XDP sockets found in the process
	// RxDropped: frames the kernel could not place, chiefly for want of a
	// FILL ring entry in copy mode.
	RxDropped uint64 `json:"rx_dropped"`
	// RxFillRingEmpty: times the kernel found the FILL ring empty
	// (xsk_rx_fill_ring_empty_descs in softrnic stats).
	RxFillRingEmpty uint64 `json:"rx_fill_ring_empty_descs"`
	RxRingFull      uint64 `json:"rx_ring_full"`
	RxInvalid       uint64 `json:"rx_invalid_descs"`
	TxInvalid       uint64 `json:"tx_invalid_descs"`
	TxRingEmpty     uint64 `json:"tx_ring_empty_descs"`
}

// xskWatch reads the AF_XDP socket statistics of another process — a
// `softrnic perf` or `softrnic daemon` — from outside it: it takes a
// duplicate of each of the process's AF_XDP sockets (pidfd_getfd, as root)
// while the process lives, and reads XDP_STATISTICS from the duplicates
// once the process is done. The duplicates keep the sockets, and so their
// final counts, after the process exits; Finish closes them, which frees
// the sockets' queues for the next run. Without XDP_SOCKETS_DIAG in the
// kernel (ss --xdp) nothing else outside the process sees these counts.
type xskWatch struct {
	pid   int
	pidfd int
	mu    sync.Mutex
	fds   map[string]int // socket inode → our duplicate
	errs  []string
	stop  chan struct{}
	done  chan struct{}
}

// watchXSK starts following pid's AF_XDP sockets, looking for new ones
// every interval until Finish.
func watchXSK(pid int, interval time.Duration) (*xskWatch, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	w := &xskWatch{pid: pid, pidfd: pidfd, fds: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			w.scan()
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w, nil
}

// scan takes a duplicate of every AF_XDP socket of the process not seen
// yet.
func (w *xskWatch) scan() {
	dir := fmt.Sprintf("/proc/%d/fd", w.pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return // exited
	}
	for _, e := range ents {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		w.mu.Lock()
		_, seen := w.fds[link]
		w.mu.Unlock()
		if seen {
			continue
		}
		target, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fd, err := unix.PidfdGetfd(w.pidfd, target, 0)
		if err != nil {
			if !errors.Is(err, unix.EBADF) && !errors.Is(err, unix.ESRCH) {
				w.note(fmt.Sprintf("pidfd_getfd %d/%d: %v", w.pid, target, err))
			}
			continue
		}
		dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
		if err != nil || dom != unix.AF_XDP {
			unix.Close(fd)
			w.mu.Lock()
			w.fds[link] = -1 // not AF_XDP: never look again
			w.mu.Unlock()
			continue
		}
		w.mu.Lock()
		w.fds[link] = fd
		w.mu.Unlock()
	}
}

func (w *xskWatch) note(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.errs) < 4 {
		w.errs = append(w.errs, s)
	}
}

// Finish stops looking, reads every AF_XDP socket found, closes them and
// returns the sums (and what went wrong, if anything). Call it after the
// process has exited, so that the counts are final.
func (w *xskWatch) Finish() (XSKStats, error) {
	close(w.stop)
	<-w.done
	var s XSKStats
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, fd := range w.fds {
		if fd < 0 {
			continue
		}
		var st unix.XDPStatistics
		n := uint32(unsafeSizeofXDPStatistics)
		if err := getsockoptXDPStatistics(fd, &st, &n); err != nil {
			w.errs = append(w.errs, fmt.Sprintf("XDP_STATISTICS: %v", err))
		} else {
			s.Sockets++
			s.RxDropped += st.Rx_dropped
			s.RxInvalid += st.Rx_invalid_descs
			s.TxInvalid += st.Tx_invalid_descs
			s.RxRingFull += st.Rx_ring_full
			s.RxFillRingEmpty += st.Rx_fill_ring_empty_descs
			s.TxRingEmpty += st.Tx_ring_empty_descs
		}
		unix.Close(fd)
	}
	w.fds = nil
	unix.Close(w.pidfd)
	if len(w.errs) > 0 {
		return s, errors.New(strings.Join(w.errs, "; "))
	}
	return s, nil
}
