#!/usr/bin/env bash
# Go: build and test a small module offline (cache in ~/.cache/go-build).
set -euo pipefail
cd "$WL_DIR"
export GOPROXY=off GOFLAGS=-mod=mod GOTOOLCHAIN=local
mkdir -p mod && cd mod
printf 'module example.com/wl\n\ngo 1.21\n' > go.mod
printf 'package wl\n\nfunc Add(a, b int) int { return a + b }\n' > add.go
printf 'package wl\n\nimport "testing"\n\nfunc TestAdd(t *testing.T) {\n\tif Add(2, 3) != 5 {\n\t\tt.Fatal("add")\n\t}\n}\n' > add_test.go
mkdir -p cmd/wl
printf 'package main\n\nimport (\n\t"fmt"\n\n\t"example.com/wl"\n)\n\nfunc main() { fmt.Println(wl.Add(2, 3)) }\n' > cmd/wl/main.go
go vet ./...
go test -count=1 ./... >/dev/null
go build -o wl ./cmd/wl
test "$(./wl)" = 5
go run ./cmd/wl | grep 5
echo go-ok
