package daemon

import (
	"context"
	"time"

	"github.com/softrnic/softrnic/capture"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/verbs"
)

// RunOptions tune RunDevice.
//
// Deprecated: use engine.Options.
type RunOptions struct {
	Tap      *capture.Tap
	IdleWait time.Duration
	SpinFor  time.Duration
}

// RunDevice is engine.Run, kept only for callers outside the daemon that
// have not moved to engine.Run yet (cmd/softrnic/rping.go and the rdmacm
// tests).
//
// Deprecated: use engine.Run.
func RunDevice(ctx context.Context, dev *verbs.Device, p port.Port, opt RunOptions) error {
	return engine.Run(ctx, dev, p, engine.Options{Tap: opt.Tap, IdleWait: opt.IdleWait, SpinFor: opt.SpinFor})
}
