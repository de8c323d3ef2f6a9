package recorder

import (
	"fmt"
	"maps"
	"slices"

	"github.com/cilium/ebpf"
)

// Programs that record the refusals of `watcher exec` commands where
// fexit programs load (bpf/include/recorder_fexit.h): the seccomp filter's
// at the exit of __secure_computing, which runs only for tasks with a
// seccomp filter, and Landlock's at the exit of the security_* functions
// it refuses from. With them no syscall-wide program (sys_enter, sys_exit)
// is needed for the refusals; where they do not load (fentry/fexit
// refused, as on some VMs) sys_enter and sys_exit record them instead.
const (
	ProgSeccompExit = "rec_seccomp"
	ProgFileOpen    = "rec_file_open"
)

// fexitPrograms are the fexit programs, loaded apart from the tracepoint
// ones so a kernel that refuses fexit still records with tracepoints.
type fexitPrograms struct {
	RecSeccomp      *ebpf.Program `ebpf:"rec_seccomp"`
	RecFileOpen     *ebpf.Program `ebpf:"rec_file_open"`
	RecPathLink     *ebpf.Program `ebpf:"rec_path_link"`
	RecPathMkdir    *ebpf.Program `ebpf:"rec_path_mkdir"`
	RecPathMknod    *ebpf.Program `ebpf:"rec_path_mknod"`
	RecPathRename   *ebpf.Program `ebpf:"rec_path_rename"`
	RecPathRmdir    *ebpf.Program `ebpf:"rec_path_rmdir"`
	RecPathSymlink  *ebpf.Program `ebpf:"rec_path_symlink"`
	RecPathTruncate *ebpf.Program `ebpf:"rec_path_truncate"`
	RecPathUnlink   *ebpf.Program `ebpf:"rec_path_unlink"`
}

// byName maps the fexit programs by their names in bpf/recorder.c.
func (p *fexitPrograms) byName() map[string]*ebpf.Program {
	return map[string]*ebpf.Program{
		"rec_seccomp": p.RecSeccomp, "rec_file_open": p.RecFileOpen, "rec_path_link": p.RecPathLink,
		"rec_path_mkdir": p.RecPathMkdir, "rec_path_mknod": p.RecPathMknod, "rec_path_rename": p.RecPathRename,
		"rec_path_rmdir": p.RecPathRmdir, "rec_path_symlink": p.RecPathSymlink,
		"rec_path_truncate": p.RecPathTruncate, "rec_path_unlink": p.RecPathUnlink,
	}
}

// FexitPrograms are the names of the fexit programs recording refusals.
var FexitPrograms = slices.Sorted(maps.Keys((&fexitPrograms{}).byName()))

// tracepointPrograms are the programs that load on every supported kernel.
type tracepointPrograms struct {
	TraceExec     *ebpf.Program `ebpf:"trace_exec"`
	TraceExit     *ebpf.Program `ebpf:"trace_exit"`
	TraceSysEnter *ebpf.Program `ebpf:"trace_sys_enter"`
	TraceSysExit  *ebpf.Program `ebpf:"trace_sys_exit"`
}

// objects are the tracepoint programs and the maps.
type objects struct {
	tracepointPrograms
	recorderMaps
}

func (o *objects) Close() error {
	return _RecorderClose(o.TraceExec, o.TraceExit, o.TraceSysEnter, o.TraceSysExit, &o.recorderMaps)
}

// loadFexit loads the fexit programs, or says why they do not load here.
func loadFexit(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions) (*fexitPrograms, error) {
	var p fexitPrograms
	if err := spec.LoadAndAssign(&p, opts); err != nil {
		return nil, fmt.Errorf("load fexit refusal programs: %w", err)
	}
	return &p, nil
}

func (p *fexitPrograms) Close() error {
	for _, prog := range p.byName() {
		prog.Close()
	}
	return nil
}

// DenialPrograms names the programs that record the refusals of watcher
// exec commands on this kernel: the fexit programs where they loaded,
// else sys_enter and sys_exit.
func (t *Recorder) DenialPrograms() []string {
	if t.fexit != nil {
		return slices.Clone(FexitPrograms)
	}
	return []string{ProgSysEnter, ProgSysExit}
}

// FexitError says why the fexit programs did not load (nil: they did, and
// refusals are recorded without syscall tracepoints).
func (t *Recorder) FexitError() error { return t.fexitErr }
