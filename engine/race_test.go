//go:build race

package engine

// raceEnabled: the race detector slows every step several times, so
// timing-dependent policies (a post within pollFresh of a Poll) are not
// checked under it.
const raceEnabled = true
