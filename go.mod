module github.com/watcherhq/watcher

go 1.26.0

tool github.com/cilium/ebpf/cmd/bpf2go

require (
	github.com/cilium/ebpf v0.22.0
	golang.org/x/sys v0.49.0
)

require golang.org/x/sync v0.22.0 // indirect
