# watcher build, test and code generation. Most targets need root (BPF).
GO ?= go
SHELL := /bin/bash
BIN := bin/watcher

.PHONY: all setup build generate generate-check test test-vm bench-vm check bench lint demo vmlinux clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/watcher

# Rebuild the bpf2go output (needs clang, llvm-strip, libbpf-dev).
generate:
	$(GO) generate ./...

# Fail when the committed bpf2go output differs from what `make generate` builds.
generate-check:
	$(GO) generate ./...
	@if ! git diff --quiet --exit-code -- '*_bpfel.go' '*_bpfel.o'; then \
		echo "bpf2go output is stale: run 'make generate' and commit"; \
		git diff --stat -- '*_bpfel.go' '*_bpfel.o'; exit 1; fi
	@if [ -n "$$(git ls-files --others --exclude-standard -- '*_bpfel.go' '*_bpfel.o')" ]; then \
		echo "uncommitted bpf2go output:"; git ls-files --others --exclude-standard -- '*_bpfel.*'; exit 1; fi

# vmlinux.h from this machine's BTF (CO-RE relocations adapt it to others).
vmlinux:
	bpftool btf dump file /sys/kernel/btf/vmlinux format c > bpf/include/vmlinux.h

# The host test suite (as root: loads BPF, creates cgroups). testreport
# prints each package's result, failed tests' output and, at the end, every
# skipped test with its reason.
test:
	set -o pipefail; $(GO) test -count=1 -timeout 30m -json ./... | $(GO) run ./test/testreport

# BPF LSM tests in a stock Debian kernel under qemu (this host refuses LSM
# programs): every guest suite, in two lanes side by side (test/vm/lanes.sh
# says which). KERNEL_PKG picks another kernel package.
test-vm:
	KERNEL_PKG=$(KERNEL_PKG) ./test/vm/lanes.sh

# The syscall loop in the qemu guest: bare, outside and inside a sandbox for
# BPF LSM and for fmod_ret (one boot each), ratios to bare in the same boot.
bench-vm:
	./test/vm/run.sh --run '^TestBenchVM$$' --env WATCHER_BENCH_VM=1 $(if $(KERNEL_PKG),--kernel-pkg $(KERNEL_PKG))

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s ./...
	@for s in bench/*.sh bench/*/run.sh; do [ -x "$$s" ] && echo "== $$s" && "$$s"; done; true

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

# Install the toolchain and test dependencies (Debian 12, as root); idempotent.
setup:
	./scripts/setup.sh

# The README's demo: a sandbox on the default policy, watched live.
demo: setup build
	./$(BIN) demo

# The README's test command, and what CI runs.
check: setup generate-check lint test test-vm

clean:
	rm -rf bin
