// Package testlink makes real devices for the tests of the packages above
// the engine (daemon, client, rdmacm, the tools): rnic devices driven by
// engines on in-memory links, one device on a loopback link or two joined
// by a memlink pair. Frames are real RoCEv2 frames with ICRCs.
package testlink
