// Command interop is the lab's runner: it boots the kernel's Soft-RoCE
// (rdma_rxe) in qemu guests built by lab/build, with their NICs on taps in
// a network namespace of its own, and runs a case file of stock rdma-core /
// perftest commands against a peer.
//
// Two modes:
//
//   - interop (default, `make interop`): one guest on tap lt0; the host side
//     of every case is a softrnic command run in the namespace, attached to
//     that tap. Cases whose softrnic subcommand is not built yet are skipped.
//   - -selfcheck (`make lab-selfcheck`): two guests on one bridge, rxe
//     against rxe, which proves the lab itself (images, boot, job loop,
//     counters, netem loss, captures) independently of softrnic, and leaves
//     fresh real captures of every case.
//
// The guests boot once per run and take the cases one after the other
// through their 9p shares. Per case the runner prints one line, and at the
// end "N passed, N failed"; it exits 1 when any case failed.
package main
