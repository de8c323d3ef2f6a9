package enforcetest

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// Exit0 is x86_64 code for exit(0): mov eax, 60; xor edi, edi; syscall.
var Exit0 = []byte{0xb8, 0x3c, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05}

// ReadPage0 reads address 0 (mov eax, [0]), then exits 0: it faults
// unless page 0 is mapped.
var ReadPage0 = append([]byte{0x8b, 0x04, 0x25, 0, 0, 0, 0}, Exit0...)

// TinyELF writes, under the test's temporary directory as name, a static
// x86_64 executable of one segment loaded at vaddr that runs code (a low
// vaddr is a mapping the ELF loader makes below vm.mmap_min_addr).
func TinyELF(t testing.TB, name string, vaddr uint64, code []byte) string {
	t.Helper()
	const hdrs = 64 + 56
	var b bytes.Buffer
	le := binary.LittleEndian
	b.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	binary.Write(&b, le, struct {
		Type, Machine              uint16
		Version                    uint32
		Entry, Phoff, Shoff        uint64
		Flags                      uint32
		Ehsize, Phentsize, Phnum   uint16
		Shentsize, Shnum, Shstrndx uint16
	}{Type: 2, Machine: 0x3e, Version: 1, Entry: vaddr + hdrs, Phoff: 64, Ehsize: 64, Phentsize: 56, Phnum: 1})
	binary.Write(&b, le, struct {
		Type, Flags          uint32
		Offset, Vaddr, Paddr uint64
		Filesz, Memsz, Align uint64
	}{Type: 1, Flags: 5, Vaddr: vaddr, Paddr: vaddr, Filesz: hdrs + uint64(len(code)), Memsz: hdrs + uint64(len(code)), Align: 4096})
	b.Write(code)
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b.Bytes(), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}
