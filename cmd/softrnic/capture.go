package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon/proto"
)

func init() {
	register("capture", "write the RoCE frames the daemon sends and receives to a pcap file", runCapture)
}

func runCapture(args []string) int {
	fs := flag.NewFlagSet("softrnic capture", flag.ContinueOnError)
	file := fs.String("w", "", "the pcap file to write (required)")
	count := fs.Int("c", 0, "stop after this many frames (0: until interrupted)")
	qp := fs.Int("qp", -1, "keep only this QP's frames (QPN)")
	control := fs.String("control", proto.DefaultControl, "the daemon's control socket")
	pcapng := fs.Bool("pcapng", false, "write pcapng, which records each frame's direction")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: softrnic capture -w FILE [-c COUNT] [--qp N] [--control PATH] [--pcapng]")
		fmt.Fprintln(fs.Output(), "\nBoth directions; root only (a capture sees every client's traffic).")
		fmt.Fprintln(fs.Output(), "Stops after COUNT frames, the file flushed when it exits; or at SIGINT/SIGTERM,")
		fmt.Fprintln(fs.Output(), "the daemon then flushing the file as it lets go of it, an instant later.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *file == "" || fs.NArg() > 0 || *count < 0 || *qp > 0xffffff {
		fs.Usage()
		return 2
	}
	c, err := client.Dial(*control)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic capture:", err)
		return 1
	}
	defer c.Close()
	// This process creates the file: it gets this user's ownership and
	// rights, and the daemon writes through the descriptor passed to it.
	f, err := os.OpenFile(*file, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic capture:", err)
		return 1
	}
	// The daemon writes through its own descriptor: closing ours loses
	// nothing.
	defer func() { _ = f.Close() }()
	opt := client.CaptureOptions{Count: *count, PCAPNG: *pcapng}
	if *qp >= 0 {
		opt.QPN, opt.FilterQP = uint32(*qp), true
	}
	run, err := c.Capture(f, opt)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic capture:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "softrnic capture: writing %s\n", *file)
	type result struct {
		st  client.CaptureStats
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := run.Wait()
		done <- result{st, err}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	select {
	case r := <-done:
		if r.err != nil {
			fmt.Fprintln(os.Stderr, "softrnic capture:", r.err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "softrnic capture: %d frames written, %d dropped\n", r.st.Written, r.st.Dropped)
		return 0
	case s := <-sig:
		// Closing the connection ends the capture; the daemon flushes the
		// file before it lets go of its descriptor, which may be just
		// after this process exits (the protocol has no "stop and tell
		// me" operation).
		c.Close()
		<-done
		fmt.Fprintf(os.Stderr, "softrnic capture: stopped by %v\n", s)
		return 0
	}
}
