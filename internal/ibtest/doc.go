// Package ibtest holds helpers that tests of several packages share for
// driving QPs through their states.
package ibtest
