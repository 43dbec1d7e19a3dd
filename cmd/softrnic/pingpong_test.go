package main

import (
	"testing"
)

// TestPingpongArgs: the subcommand rejects what it cannot run with usage
// errors (2) before it touches any interface.
func TestPingpongArgs(t *testing.T) {
	for _, args := range [][]string{{}, {"-h"}, {"xx", "-d", "lo"}, {"rc"}, {"ud", "-d", "lo", "-q"}, {"rc", "-d", "lo", "-m", "1000"}, {"rc", "-d", "lo", "a", "b"}} {
		if rc := runPingpong(args); rc != 2 {
			t.Errorf("%q: exit %d, want 2", args, rc)
		}
	}
	if rc := runPingpong([]string{"rc", "--help"}); rc != 0 {
		t.Errorf("rc --help: exit %d", rc)
	}
}
