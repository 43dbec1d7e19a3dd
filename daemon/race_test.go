//go:build race

package daemon_test

// raceDetector: the race detector's shadow memory grows with the heap and
// is not returned, so the process's RSS and mapping count say nothing of
// what the daemon holds.
const raceDetector = true
