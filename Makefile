# softrnic — build, test and measure. Every target works on a fresh Debian machine after `make deps`.
GO       ?= go
PKGS     := ./...
BIN      := bin/softrnic
FUZZTIME ?= 10s
# golangci-lint, from the Go module proxy at this version, into bin/ (make lint installs it).
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT         := bin/golangci-lint-$(GOLANGCI_LINT_VERSION)

# Debian packages the build, the tests and the lab need (clang/llvm/libbpf-dev only for `make generate`);
# the C library builds against libibverbs-dev, and the stock RDMA programs test it.
DEB_PKGS := iproute2 ethtool nftables tcpdump sockperf \
            qemu-system-x86 debootstrap cpio kmod \
            gcc make libc6-dev libibverbs-dev librdmacm-dev perftest ibverbs-utils rdmacm-utils python3-pyverbs
# Where `make install` puts the drop-in libraries (`softrnic run` looks beside the binary too).
LIBDIR   ?= /usr/local/lib/softrnic

.PHONY: all deps build clib demo test test-race test-long fuzz bench bench-loss bench-stock lint generate sim-demo sim-sweep sim-workload dcqcn-live cc-live veth-stall install lab interop lab-selfcheck clean

all: build

## deps: install the Debian packages and Go modules everything here needs (run as root)
deps:
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEB_PKGS)
	$(GO) mod download
	$(MAKE) $(GOLANGCI_LINT)

## build: the softrnic binary in bin/
build:
	$(GO) build -o $(BIN) ./cmd/softrnic

## clib: the drop-in libibverbs.so.1 and librdmacm.so.1 (plain and AddressSanitizer) and their C test programs, in c/build/
clib:
	$(MAKE) -C c

## demo: two softrnic hosts in namespaces over veth, perftest-compatible runs over AF_XDP with data checks (root)
demo: build
	demo/demo.sh $(BIN)

## test: every package's tests (root-only tests run when root, skip otherwise), then the race detector on the concurrent ones
test:
	$(GO) test -count=1 -timeout 30m $(PKGS)
	$(MAKE) test-race

RACE_PKGS := $(shell $(GO) list ./verbs/... ./transport/... ./port/... ./internal/route/... ./internal/netnstest/... ./internal/shmring/... ./engine/... ./host/... ./daemon/... ./client/... ./internal/capture/... ./internal/perftest/... ./rnic/... ./rdmacm/... ./internal/rdmacm/... 2>/dev/null)
test-race:
	$(if $(RACE_PKGS),$(GO) test -race -count=1 -timeout 20m $(RACE_PKGS),@echo "no concurrent packages yet")

## test-long: the exhaustive sweeps that the default run samples
test-long:
	SOFTRNIC_SIM_LONG=1 $(GO) test -count=1 -timeout 20m -run 'TestNFlow|TestConnectXAtScale|TestLiterature' -v ./sim/
	SOFTRNIC_E2E_LONG=1 $(GO) test -count=1 -timeout 30m -run TestE2ERC ./rnic
	SOFTRNIC_EXHAUSTIVE=1 $(GO) test -count=1 -timeout 30m -run 'TestLoopback|TestLossSweep|TestGoodputComparison' ./transport/rc

## fuzz: every fuzz target, found in the packages' tests (go test -list), for FUZZTIME each
FUZZ_FLAGS := -fuzzminimizetime 2s
fuzz:
	@set -e; for d in $$($(GO) list -f '{{.Dir}}' $(PKGS)); do \
		grep -qs '^func Fuzz' $$d/*_test.go || continue; \
		for t in $$(cd $$d && $(GO) test -list '^Fuzz' . | grep '^Fuzz'); do \
			echo "== $$d $$t"; \
			(cd $$d && $(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $(FUZZ_FLAGS) .); \
		done; \
	done

## bench: micro-benchmarks of the wire formats, links, CM and simulator, then the raw I/O, data path, external-memory copies, stock-program and loss tables
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./bth ./icrc ./frame ./port/memlink ./cm
	$(GO) test -run '^$$' -bench . -benchtime 3x ./sim/ ./congestion/...
	$(GO) test -run '^$$' -bench 'RCPair' -benchmem -benchtime 200000x ./rnic
	$(GO) test -run '^$$' -bench 'GoodputLoss' -benchtime 1x ./rnic
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./internal/shmring ./internal/capture ./client
	$(GO) test -run '^$$' -bench Send64 -benchtime 2s ./daemon
	$(GO) run ./bench/io -json out/bench-io.json
	$(GO) run ./bench/rnic -json out/bench-rnic.json
	$(GO) test -run '^$$' -bench 'ExternalCopy' -benchtime 2000x ./rnic
	$(MAKE) bench-stock
	$(MAKE) bench-loss

## bench-stock: root, ~2 min; stock ib_send_lat -s 64, ib_send_bw -s 64 and ib_write_bw -s 65536 through softrnic run (a daemon each end) beside softrnic perf in process on the same veth, interleaved rounds, the ratios and their goals; out/bench-stock.json (BENCH_STOCK_FLAGS: bench/stock -h)
BENCH_STOCK_FLAGS ?=
bench-stock: build clib
	$(GO) run ./bench/stock -softrnic $(BIN) -clib c/build/lib -json out/bench-stock.json $(BENCH_STOCK_FLAGS)

## bench-loss: root, 2-3 min; `softrnic perf write_bw` over a bridge dropping 0/1/3 % of RoCEv2 frames each way (-u 14 and 8), by QP count at MTU 1500 and 4200 with the receiver's AF_XDP drops, and with a daemon receiver; tables, goals and out/bench-loss.json (BENCH_LOSS_FLAGS: bench/loss -h)
BENCH_LOSS_FLAGS ?=
bench-loss: build
	$(GO) run ./bench/loss -softrnic $(BIN) -json out/bench-loss.json $(BENCH_LOSS_FLAGS)

## bench-hostile: root, ~3 min; each attack of a hostile local client (silent connections, CQ and MR floods, huge queues, a controlled Q_Key, bad WRs) on a fresh daemon beside a write_bw stream through it: what the daemon did, its fds, mappings and memory (BENCH_HOSTILE_FLAGS: bench/hostile -h)
BENCH_HOSTILE_FLAGS ?=
bench-hostile: build
	$(GO) run ./bench/hostile -softrnic $(BIN) -json out/bench-hostile.json $(BENCH_HOSTILE_FLAGS)

## sim-demo: the two-flow scenario of the DCQCN paper under DCQCN, HPCC, TIMELY and Swift: traces, summary and SVG figures in out/sim-two-flow/ALG
sim-demo: build
	for a in dcqcn hpcc timely swift; do $(BIN) sim $$a --scenario two-flow --out out/sim-two-flow/$$a || exit 1; done

## sim-workload: WebSearch at 30 % load on the HPCC paper's 320-server fat-tree for 10 ms under all four algorithms (two at a time, ~20 s each), then their FCT slowdown side by side (out/sim-workload/compare)
SIM_WORKLOAD_FLAGS ?= --preset hpcc --cdf websearch --load 0.3 --duration 10ms
sim-workload: build
	$(BIN) sim dcqcn $(SIM_WORKLOAD_FLAGS) --quiet --out out/sim-workload/dcqcn & a=$$!; \
	$(BIN) sim hpcc $(SIM_WORKLOAD_FLAGS) --quiet --out out/sim-workload/hpcc & b=$$!; wait $$a && wait $$b
	$(BIN) sim timely $(SIM_WORKLOAD_FLAGS) --quiet --out out/sim-workload/timely & a=$$!; \
	$(BIN) sim swift $(SIM_WORKLOAD_FLAGS) --quiet --out out/sim-workload/swift & b=$$!; wait $$a && wait $$b
	$(BIN) sim compare --out out/sim-workload/compare out/sim-workload/dcqcn out/sim-workload/hpcc out/sim-workload/timely out/sim-workload/swift

## sim-sweep: the two-flow scenario over 20 seeds: per-flow mean/min/max/stdev, seeds outside 20 ± 1 Gb/s, histogram (out/sim-sweep)
sim-sweep:
	$(GO) run ./cmd/softrnic sim dcqcn --scenario two-flow --seeds 20 --out out/sim-sweep

## dcqcn-live: live two-flow experiment (root, ~35 s): two softrnic DCQCN flows h1,h2 -> sw (tbf + tc-bpf ECN marker) -> r, one perf server for both, time dilation S=400; results in out/dcqcn-live
DCQCN_LIVE_FLAGS ?=
dcqcn-live:
	$(GO) run ./lab/dcqcnlive -out out/dcqcn-live $(DCQCN_LIVE_FLAGS)

## cc-live: the same testbed with Swift (root, ~40 s; CC_LIVE_FLAGS='-cc timely' for TIMELY), its figures beside the simulator's for the same scaled scenario; results in out/cc-live
CC_LIVE_FLAGS ?= -cc swift
cc-live:
	$(GO) run ./lab/dcqcnlive -out out/cc-live $(CC_LIVE_FLAGS)

## install: the binary, the systemd unit and an example configuration (root)
install: build clib
	install -m 0755 $(BIN) /usr/local/bin/softrnic
	install -D -m 0755 c/build/lib/libibverbs.so.1 $(LIBDIR)/libibverbs.so.1
	install -D -m 0755 c/build/lib/librdmacm.so.1 $(LIBDIR)/librdmacm.so.1
	install -D -m 0644 contrib/softrnic.service /etc/systemd/system/softrnic.service
	test -e /etc/softrnic/softrnic.conf || install -D -m 0644 contrib/softrnic.conf.example /etc/softrnic/softrnic.conf

## lab: build the interop lab's guest (Debian kernel with rdma_rxe, rdma-core, perftest) into lab/cache (cached)
lab:
	./lab/build

## interop: boot the lab guest and run lab/interop/cases.txt against bin/softrnic and, for the stock/ cases, c/build/lib (root); INTEROP_FLAGS=-only REGEXP to run a subset
INTEROP_FLAGS ?=
interop: build clib lab
	$(GO) run ./lab/interop -softrnic $(BIN) $(INTEROP_FLAGS)

## lab-selfcheck: rxe against rxe in two guests, proving the lab itself; captures in out/lab/ (root)
lab-selfcheck: build lab
	$(GO) run ./lab/interop -selfcheck

## lint: gofmt, go vet, golangci-lint (.golangci.yaml), the layout rules below, the C libraries with -Wall -Wextra -Werror
lint: clib $(GOLANGCI_LINT)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GOLANGCI_LINT) run $(PKGS)
	@# Tools' packages that are not API live under internal/; every package says what it is in a doc.go.
	@bad=$$($(GO) list -f '{{if ne .Name "main"}}{{.ImportPath}}{{end}}' ./bench/... ./lab/... ./cmd/... | grep -v '/internal/' || true); \
	if [ -n "$$bad" ]; then echo "library packages of a tool must be under internal/:"; echo "$$bad"; exit 1; fi
	@bad=$$(for d in $$($(GO) list -f '{{if .GoFiles}}{{.Dir}}{{end}}' $(PKGS)); do [ -f $$d/doc.go ] || echo "$${d#$(CURDIR)/}"; done); \
	if [ -n "$$bad" ]; then echo "packages without a doc.go:"; echo "$$bad"; exit 1; fi

$(GOLANGCI_LINT):
	GOBIN=$(CURDIR)/bin/.tools $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv bin/.tools/golangci-lint $@

## veth-stall: root; 20 loaded runs of a 64 B send_lat between two namespaces (two CPU hogs), with a trace of any RoCE frame a veth hands to the stack instead of XDP (bench/io/veth-stall.sh -h)
VETH_STALL_FLAGS ?= -r 20
veth-stall:
	bench/io/veth-stall.sh $(VETH_STALL_FLAGS)

## generate: rebuild the committed BPF objects (needs clang, llvm, libbpf-dev)
generate:
	$(GO) generate ./bpf/... ./bench/io/vethtrace/... ./lab/dcqcnlive/...

clean:
	rm -rf bin out
	$(MAKE) -C c clean
