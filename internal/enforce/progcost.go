package enforce

// What each of watcher's BPF programs costs, from the kernel's own BPF
// statistics: runs and run time over a window. The kernel counts them only
// while someone holds BPF_ENABLE_STATS (the accounting itself adds two
// clock reads to every run), so they are turned on for the window alone.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// ProgramCost is one program's runs and run time in a window.
type ProgramCost struct {
	ID      ebpf.ProgramID
	Name    string
	Type    string // the kernel's program type (Tracing, CGroupSKB, LSM...)
	Links   int    // links attaching it now
	Runs    uint64
	Runtime time.Duration
}

// NsPerRun is the mean run time, 0 without runs.
func (c ProgramCost) NsPerRun() float64 {
	if c.Runs == 0 {
		return 0
	}
	return float64(c.Runtime.Nanoseconds()) / float64(c.Runs)
}

// OwnPrograms lists the programs of the agent pinned under pinDir: those
// using a map pinned there (every object shares the core maps) or attached
// by a link pinned there. Programs of other tools are left out.
func OwnPrograms(pinDir string) (map[ebpf.ProgramID]bool, error) {
	maps := map[ebpf.MapID]bool{}
	progs := map[ebpf.ProgramID]bool{}
	err := filepath.WalkDir(pinDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
			if info, err := m.Info(); err == nil {
				if id, ok := info.ID(); ok {
					maps[id] = true
				}
			}
			m.Close()
			return nil
		}
		if l, err := link.LoadPinnedLink(path, &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
			if info, err := l.Info(); err == nil {
				progs[info.Program] = true
			}
			l.Close()
			return nil
		}
		if p, err := ebpf.LoadPinnedProgram(path, nil); err == nil {
			if info, err := p.Info(); err == nil {
				if id, ok := info.ID(); ok {
					progs[id] = true
				}
			}
			p.Close()
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no agent pins under %s: is the agent running with this pin directory? %w", pinDir, err)
		}
		return nil, fmt.Errorf("read pins under %s: %w", pinDir, err)
	}
	if len(maps) == 0 && len(progs) == 0 {
		return nil, fmt.Errorf("no pinned maps or links under %s: is the agent running with this pin directory?", pinDir)
	}
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("list programs: %w", err)
		}
		id = next
		if progs[id] {
			continue
		}
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded since it was listed
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			continue
		}
		ids, _ := info.MapIDs()
		for _, m := range ids {
			if maps[m] {
				progs[id] = true
				break
			}
		}
	}
	return progs, nil
}

// MeasurePrograms turns the kernel's BPF statistics on for window (or
// until ctx ends) and returns what each program of ids ran in it, the
// most expensive in total first. A program unloaded during the window is
// left out.
func MeasurePrograms(ctx context.Context, ids map[ebpf.ProgramID]bool, window time.Duration) ([]ProgramCost, error) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable BPF run-time statistics: %w", err)
	}
	defer stats.Close()
	type open struct {
		p     *ebpf.Program
		first ProgramCost
	}
	var progs []open
	defer func() {
		for _, o := range progs {
			o.p.Close()
		}
	}()
	links, err := LinkedPrograms()
	if err != nil {
		return nil, err
	}
	for id := range ids {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		info, err := p.Info()
		if err != nil {
			p.Close()
			continue
		}
		c := ProgramCost{ID: id, Name: info.Name, Type: info.Type.String(), Links: links[id]}
		if s, err := p.Stats(); err == nil {
			c.Runs, c.Runtime = s.RunCount, s.Runtime
		}
		progs = append(progs, open{p, c})
	}
	select {
	case <-time.After(window):
	case <-ctx.Done():
	}
	out := make([]ProgramCost, 0, len(progs))
	for _, o := range progs {
		s, err := o.p.Stats()
		if err != nil {
			continue
		}
		c := o.first
		c.Runs, c.Runtime = s.RunCount-c.Runs, s.Runtime-c.Runtime
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Runtime != out[j].Runtime {
			return out[i].Runtime > out[j].Runtime
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}
