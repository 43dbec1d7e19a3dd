// Package frametest loads the RoCEv2 test vectors (real captures under
// ../shared/vectors/ from the repository root) for the tests of the wire
// format packages and tools. It reads pcap and pcapng with gopacket's pure
// Go pcapgo, and deliberately knows nothing about RoCE: it returns whole
// Ethernet frames, so that the packages under test do all the decoding.
package frametest
