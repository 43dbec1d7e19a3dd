package netnstest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"time"
)

// TCPCheck listens in server (on addr, an IP of server's), connects from
// client, and echoes a message over the connection, all bounded in time. It
// proves the kernel's TCP path works between the namespaces, as the TCP side
// channels of perftest and rdma_cm need while the XDP program is attached.
func TCPCheck(client, server *NS, addr string) error {
	var ln net.Listener
	if err := server.Do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(addr, "0"))
		return err
	}); err != nil {
		return fmt.Errorf("netnstest: listen: %w", err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
			errc <- err
			return
		}
		_, err = io.Copy(c, io.LimitReader(c, 64))
		errc <- err
	}()
	var c net.Conn
	if err := client.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		return err
	}); err != nil {
		return fmt.Errorf("netnstest: dial: %w", err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return fmt.Errorf("netnstest: deadline: %w", err)
	}
	msg := bytes.Repeat([]byte("softrnic"), 8)
	if _, err := c.Write(msg); err != nil {
		return fmt.Errorf("netnstest: write: %w", err)
	}
	back := make([]byte, len(msg))
	if _, err := io.ReadFull(c, back); err != nil {
		return fmt.Errorf("netnstest: read echo: %w", err)
	}
	if !bytes.Equal(back, msg) {
		return fmt.Errorf("netnstest: echo mismatch")
	}
	return <-errc
}
