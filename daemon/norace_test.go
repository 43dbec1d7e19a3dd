//go:build !race

package daemon_test

const raceDetector = false
