package rc

import (
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/transport"
)

// Build writes the whole transport packet BuildHeader describes into buf
// (headers, payload gathered from memory, pad; no ICRC) and returns its
// length, 0 when there is nothing to send: the packet the device would
// frame, as the tests look at it.
func (q *QP) Build(now clock.Time, buf []byte) int {
	var p transport.Payload
	return gather(buf, q.BuildHeader(now, buf, &p), &p)
}

// gather puts p and its pad behind the n bytes of headers in buf and
// returns the packet's length (0 for no packet).
func gather(buf []byte, n int, p *transport.Payload) int {
	if n == 0 {
		return 0
	}
	sg, off := p.Memory()
	m := ib.CopyIn(buf[n:n+p.Len()], sg, off)
	pad := -m & 3
	clear(buf[n+m : n+m+pad])
	return n + m + pad
}
