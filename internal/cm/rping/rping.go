package rping

import (
	"encoding/binary"
	"errors"
	"strconv"
)

// Protocol constants of rping.
const (
	InfoSize    = 16   // struct rping_rdma_info: be64 buf, be32 rkey, be32 size
	DefaultPort = 7174 // rping -p
	DefaultSize = 64   // rping -S
	// MinSize fits the longest "rdma-ping-%d: " prefix and a NUL, as rping
	// checks; MaxSize is rping's buffer limit.
	MinSize = 26
	MaxSize = 64*1024 - 1
	// RQDepth is the receive queue rping posts: one Info at a time, plus
	// one so that the next SEND never meets an empty queue.
	RQDepth = 2
	// ResponderResources and InitiatorDepth are rping's rdma_conn_param
	// (one RDMA READ in flight); RetryCount and RNRRetry likewise.
	ResponderResources = 1
	InitiatorDepth     = 1
	RetryCount         = 7
	RNRRetry           = 7
)

// ErrBadInfo is returned for a received message that is not an Info.
var ErrBadInfo = errors.New("rping: received message is not a 16-byte rping_rdma_info")

// Info advertises a buffer: its address, rkey and size. The server's "go
// ahead" SENDs carry an all-zero Info.
type Info struct {
	Buf  uint64
	RKey uint32
	Size uint32
}

// Encode writes i into b (at least InfoSize bytes), big-endian.
func (i Info) Encode(b []byte) {
	binary.BigEndian.PutUint64(b[0:], i.Buf)
	binary.BigEndian.PutUint32(b[8:], i.RKey)
	binary.BigEndian.PutUint32(b[12:], i.Size)
}

// DecodeInfo parses a received SEND. rping accepts exactly InfoSize bytes.
func DecodeInfo(b []byte) (Info, error) {
	if len(b) != InfoSize {
		return Info{}, ErrBadInfo
	}
	return Info{Buf: binary.BigEndian.Uint64(b), RKey: binary.BigEndian.Uint32(b[8:]), Size: binary.BigEndian.Uint32(b[12:])}, nil
}

// FillPing writes the data of ping number n into buf as rping does, so
// that `rping -v` prints the same lines and data checks agree: the text
// "rdma-ping-<n>: " then letters cycling 'A'…'z' from a start letter that
// advances by one each ping, and a final NUL.
func FillPing(buf []byte, n int) {
	if len(buf) == 0 {
		return
	}
	var prefix [32]byte
	p := append(prefix[:0], "rdma-ping-"...)
	p = strconv.AppendInt(p, int64(n), 10)
	p = append(p, ": "...)
	// snprintf stops at len-1 characters and writes a NUL.
	cc := copy(buf[:len(buf)-1], p)
	if cc < len(buf)-1 {
		buf[cc] = 0
	}
	c := byte(65 + n%58) // 'A' + ping, wrapping after 'z' (122)
	for i := len(p); i < len(buf); i++ {
		buf[i] = c
		if c++; c > 122 {
			c = 65
		}
	}
	buf[len(buf)-1] = 0
}

// WriteLen is how much the server writes back: the string in its buffer
// with its NUL (strlen + 1), at most len(buf).
func WriteLen(buf []byte) int {
	for i, b := range buf {
		if b == 0 {
			return i + 1
		}
	}
	return len(buf)
}

// ActionKind is what a machine asks the caller to post.
type ActionKind uint8

const (
	ActNone      ActionKind = iota
	ActSendInfo             // post a SEND of Info
	ActRDMARead             // post an RDMA READ of Remote.Size bytes at Remote into the local buffer
	ActRDMAWrite            // post an RDMA WRITE of Len bytes of the local buffer to Remote
	ActDone                 // the test is over: disconnect
)

// Action is one thing to post.
type Action struct {
	Kind   ActionKind
	Info   Info // ActSendInfo
	Remote Info // ActRDMARead, ActRDMAWrite
	Len    int  // ActRDMAWrite
}

// Client is the active side of rping.
type Client struct {
	// Start and Sink describe the client's two registered buffers (remote
	// read and write access): the server reads Start and writes Sink.
	Start, Sink Info
	// Count is the number of pings (0: forever).
	Count int
	ping  int
	state clientState
}

type clientState uint8

const (
	clientIdle clientState = iota
	clientReadAdv
	clientWriteAdv
	clientDone
)

// ErrUnexpected reports a message or completion out of protocol order.
var ErrUnexpected = errors.New("rping: message out of protocol order")

// Begin starts ping 0: the caller fills Start's buffer with FillPing(…, 0)
// and posts the returned SEND.
func (c *Client) Begin() Action {
	c.ping, c.state = 0, clientReadAdv
	return Action{Kind: ActSendInfo, Info: c.Start}
}

// Ping is the number of the ping in progress.
func (c *Client) Ping() int { return c.ping }

// OnRecv takes a "go ahead" from the server. After the first, the client
// advertises Sink; after the second, the ping is done: the caller checks
// Sink against Start (rping -V) and, unless the action is ActDone, fills
// Start with FillPing(…, Ping()) and posts the SEND.
func (c *Client) OnRecv(msg []byte) (Action, error) {
	if _, err := DecodeInfo(msg); err != nil {
		return Action{}, err
	}
	switch c.state {
	case clientReadAdv:
		c.state = clientWriteAdv
		return Action{Kind: ActSendInfo, Info: c.Sink}, nil
	case clientWriteAdv:
		c.ping++
		if c.Count > 0 && c.ping >= c.Count {
			c.state = clientDone
			return Action{Kind: ActDone}, nil
		}
		c.state = clientReadAdv
		return Action{Kind: ActSendInfo, Info: c.Start}, nil
	default:
		return Action{}, ErrUnexpected
	}
}

// Server is the passive side of rping.
type Server struct {
	// Buf is the server's registered buffer (its rping -S size); data read
	// from the client lands there and is written back from there.
	Buf    []byte
	remote Info
	state  serverState
}

type serverState uint8

const (
	serverWaitStart serverState = iota
	serverReading
	serverWaitSink
	serverWriting
)

// OnRecv takes the client's Info. The start advertisement yields an RDMA
// READ of the client's buffer; the sink advertisement an RDMA WRITE of the
// string read.
func (s *Server) OnRecv(msg []byte) (Action, error) {
	info, err := DecodeInfo(msg)
	if err != nil {
		return Action{}, err
	}
	switch s.state {
	case serverWaitStart:
		if int(info.Size) > len(s.Buf) {
			return Action{}, ErrBadInfo // it would overrun our buffer
		}
		s.remote, s.state = info, serverReading
		return Action{Kind: ActRDMARead, Remote: info}, nil
	case serverWaitSink:
		s.remote, s.state = info, serverWriting
		n := min(WriteLen(s.Buf), int(info.Size))
		return Action{Kind: ActRDMAWrite, Remote: info, Len: n}, nil
	default:
		return Action{}, ErrUnexpected
	}
}

// OnComplete takes the completion of the READ or WRITE just posted and
// yields the "go ahead" SEND (an all-zero Info, as rping sends).
func (s *Server) OnComplete() (Action, error) {
	switch s.state {
	case serverReading:
		s.state = serverWaitSink
	case serverWriting:
		s.state = serverWaitStart
	default:
		return Action{}, ErrUnexpected
	}
	return Action{Kind: ActSendInfo}, nil
}
