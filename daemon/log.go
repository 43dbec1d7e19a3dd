package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

func parseLevel(v string) (slog.Level, error) {
	switch strings.ToLower(v) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("%q is not a log level (debug, info, warn, error)", v)
}

// NewLogger builds the daemon's structured logger from the configuration:
// text (key=value, readable in the journal) or JSON (for log shippers), at
// the configured level. Every record carries the interface so that the logs
// of several daemons on one host can be told apart.
func NewLogger(w io.Writer, c *Config) (*slog.Logger, error) {
	lvl, err := parseLevel(c.LogLevel)
	if err != nil {
		return nil, &KeyError{Key: "log-level", Err: err}
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if os.Getenv("JOURNAL_STREAM") != "" {
		// Under systemd the journal stamps every line; a second timestamp
		// is noise.
		opts.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}
	}
	var h slog.Handler
	switch c.LogFormat {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text", "":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, &KeyError{Key: "log-format", Err: fmt.Errorf("%q is not text or json", c.LogFormat)}
	}
	l := slog.New(h)
	if c.Interface != "" {
		l = l.With("dev", c.Interface)
	}
	return l, nil
}
