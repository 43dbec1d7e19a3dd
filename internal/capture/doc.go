// Package capture records the RoCE frames a softrnic engine sends and
// receives to a pcap or pcapng file that Wireshark and tcpdump open: the
// writer side of "softrnic capture".
//
// The engine holds a Tap and, once per batch of frames, asks it for the
// running Session: one atomic load, nil when no capture runs, so an idle tap
// costs the data path nothing else. While a capture runs, the engine hands
// each frame to the Session, which copies it (up to the snap length) into a
// preallocated lock-free multi-producer queue and returns; a writer
// goroutine drains the queue into the file. A full queue drops the frame and
// counts it: a capture never slows the data path down to the speed of a
// disk.
package capture
