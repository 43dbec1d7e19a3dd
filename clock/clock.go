package clock

import (
	"math"
	"time"
)

// Time is an instant in nanoseconds since an arbitrary epoch. Only
// differences between Times are meaningful.
type Time int64

// Never is a deadline that does not expire. Min(Never, t) == t for every t.
const Never Time = math.MaxInt64

// Add returns t+d, saturating at Never so that adding to Never stays Never.
func (t Time) Add(d time.Duration) Time {
	if t == Never || (d > 0 && t > Never-Time(d)) {
		return Never
	}
	return t + Time(d)
}

// Sub returns the duration t-u.
func (t Time) Sub(u Time) time.Duration { return time.Duration(t - u) }

// Before reports whether t is strictly earlier than u.
func (t Time) Before(u Time) bool { return t < u }

// Min returns the earlier of two deadlines.
func Min(a, b Time) Time {
	if a < b {
		return a
	}
	return b
}

// String formats t as a duration since the epoch, or "never".
func (t Time) String() string {
	if t == Never {
		return "never"
	}
	return time.Duration(t).String()
}

var epoch = time.Now()

// Now reads the monotonic clock. Only the engine and tools call it; state
// machines must take time as an argument instead.
func Now() Time { return Time(time.Since(epoch)) }
