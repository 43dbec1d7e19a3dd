package pingpong

import (
	"fmt"
	"io"
)

// ClientExchange is the client's half of the side channel: it sends its
// record, reads the server's and sends "done". The server has connected
// its QP before it answers, so the client may send as soon as its own QP
// is connected.
func ClientExchange(conn io.ReadWriter, local Dest) (Dest, error) {
	rec := local.Marshal()
	if _, err := conn.Write(rec[:]); err != nil {
		return Dest{}, fmt.Errorf("pingpong: send local address: %w", err)
	}
	var in [RecordLen]byte
	if _, err := io.ReadFull(conn, in[:]); err != nil {
		return Dest{}, fmt.Errorf("pingpong: read remote address: %w", err)
	}
	remote, err := ParseDest(in[:])
	if err != nil {
		return Dest{}, err
	}
	if _, err := conn.Write(done[:]); err != nil {
		return Dest{}, fmt.Errorf("pingpong: send done: %w", err)
	}
	return remote, nil
}

// ServerExchange is the server's half: it reads the client's record,
// connects its QP to it (connect), sends its own record and waits for the
// client's "done", as the stock server does before it starts. Connecting
// before answering matters: the client sends its first message as soon as
// it has the answer.
func ServerExchange(conn io.ReadWriter, local Dest, connect func(remote Dest) error) (Dest, error) {
	var in [RecordLen]byte
	if _, err := io.ReadFull(conn, in[:]); err != nil {
		return Dest{}, fmt.Errorf("pingpong: read remote address: %w", err)
	}
	remote, err := ParseDest(in[:])
	if err != nil {
		return Dest{}, err
	}
	if err := connect(remote); err != nil {
		return Dest{}, err
	}
	rec := local.Marshal()
	if _, err := conn.Write(rec[:]); err != nil {
		return Dest{}, fmt.Errorf("pingpong: send local address: %w", err)
	}
	var d [len(done)]byte
	if _, err := io.ReadFull(conn, d[:]); err != nil {
		return Dest{}, fmt.Errorf("pingpong: read done: %w", err)
	}
	if d != done {
		return Dest{}, fmt.Errorf("pingpong: expected \"done\" from the client, got %q", d[:])
	}
	return remote, nil
}
