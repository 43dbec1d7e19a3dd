// Package netnstest creates and removes network namespaces and veth pairs for
// softrnic's integration tests and benches, so that test traffic only ever
// flows between hosts the test made.
//
// Names are unique per process and call (prefix, pid and a random suffix),
// every namespace is removed by Close (or by the test's Cleanup, which runs
// even when the test fails), and removing a namespace removes the veth ends
// inside it. It drives iproute2's ip(8), which every Linux host with
// namespaces has, rather than re-implementing netlink plumbing here.
package netnstest
