# softrnic — build, test and measure. Every target works on a fresh Debian machine after `make deps`.
GO       ?= go
PKGS     := ./...
BIN      := bin/softrnic
FUZZTIME ?= 10s

# Debian packages the build, the tests and the lab need (clang/llvm/libbpf-dev only for `make generate`).
DEB_PKGS := iproute2 ethtool nftables tcpdump sockperf \
            qemu-system-x86 debootstrap cpio kmod

.PHONY: all deps build test test-race fuzz bench lint generate clean

all: build

## deps: install the Debian packages and Go modules everything here needs (run as root)
deps:
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEB_PKGS)
	$(GO) mod download

## build: the softrnic binary in bin/
build:
	$(GO) build -o $(BIN) ./cmd/softrnic

## test: every package's tests (root-only tests run when root, skip otherwise), then the race detector on the concurrent ones
test:
	$(GO) test -count=1 -timeout 30m $(PKGS)
	$(MAKE) test-race

RACE_PKGS := $(shell $(GO) list ./verbs/... ./transport/... ./port/memlink/... ./shmring/... ./engine/... 2>/dev/null)
test-race:
	$(if $(RACE_PKGS),$(GO) test -race -count=1 -timeout 20m $(RACE_PKGS),@echo "no concurrent packages yet")

## lint: gofmt, go vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

## generate: rebuild the committed BPF objects (needs clang, llvm, libbpf-dev)
generate:
	$(GO) generate ./bpf/...

clean:
	rm -rf bin out
