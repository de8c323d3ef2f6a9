package agent

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
	"github.com/watcherhq/watcher/internal/plan"
)

// Inode entries follow the files. The LSM and backstop tables hold the
// inodes of exact rules' files and of the files below read-protecting
// prefix rules as they were when the rules were written, so another name
// for such a file (a hard link made outside the sandbox, a link made
// before the file was moved in, a bind mount) is judged like its path. A
// file replaced by rename (passwd writes a temporary file and renames it
// over /etc/shadow), created or moved in later has a new inode: the agent
// watches the directories where that can happen (inotify) and writes the
// file rules again, and records that it did.

// maxInodeWatchDirs bounds the directories watched.
const maxInodeWatchDirs = 1024

// inodeSettle is how long a burst of changes may go on before the rules
// are written again (a tool replacing a file makes several changes).
const inodeSettle = 50 * time.Millisecond

type inodeWatch struct {
	f    *os.File
	mu   sync.Mutex
	wds  map[int32]string // watch descriptor -> directory
	dirs map[string]int32
}

func newInodeWatch() (*inodeWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, err
	}
	return &inodeWatch{f: os.NewFile(uintptr(fd), "inotify"), wds: map[int32]string{}, dirs: map[string]int32{}}, nil
}

const inodeWatchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_DELETE |
	unix.IN_ONLYDIR | unix.IN_DONT_FOLLOW

// set watches dirs (and stops watching the others).
func (w *inodeWatch) set(dirs []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	want := map[string]bool{}
	for _, d := range dirs {
		want[d] = true
		if _, ok := w.dirs[d]; ok {
			continue
		}
		wd, err := unix.InotifyAddWatch(int(w.f.Fd()), d, inodeWatchMask)
		if err != nil {
			continue // gone already, or not a directory: nothing to follow
		}
		w.wds[int32(wd)], w.dirs[d] = d, int32(wd)
	}
	for d, wd := range w.dirs {
		if !want[d] {
			unix.InotifyRmWatch(int(w.f.Fd()), uint32(wd))
			delete(w.dirs, d)
			delete(w.wds, wd)
		}
	}
}

// next blocks until a change and returns the paths changed in the burst it
// starts, sorted.
func (w *inodeWatch) next() ([]string, error) {
	buf := make([]byte, 16<<10)
	changed := map[string]bool{}
	w.f.SetReadDeadline(time.Time{})
	for {
		n, err := w.f.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) && len(changed) > 0 {
			break
		}
		if err != nil {
			return nil, err
		}
		w.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameLen := int(ev.Len)
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+nameLen]), "\x00")
			if dir, ok := w.wds[ev.Wd]; ok && name != "" {
				changed[filepath.Join(dir, name)] = true
			}
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				changed["(inotify queue overflowed)"] = true
			}
			off += unix.SizeofInotifyEvent + nameLen
		}
		w.mu.Unlock()
		w.f.SetReadDeadline(time.Now().Add(inodeSettle))
	}
	out := make([]string, 0, len(changed))
	for p := range changed {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

func (w *inodeWatch) close() { w.f.Close() }

// inodeWatchDirs are the directories whose changes can give plan's path
// rules other inodes (enforce.WatchDirs), but none of the agent's own
// (skip): the ledger and sockets change all the time, and the rules
// written again are recorded in the ledger.
func inodeWatchDirs(p *plan.Plan, skip []string) []string {
	var exact, prefixes []string
	for _, r := range p.LSM {
		for _, pr := range r.Paths {
			switch {
			case !pr.Prefix:
				exact = append(exact, pr.Path)
			case pr.Path != "/" && pr.Decision.Action != enforce.ActionAllow && (pr.Access == 0 || pr.Access&lsmrules.AccessRead != 0):
				prefixes = append(prefixes, pr.Path)
			}
		}
	}
	for _, pr := range p.Backstop.Paths {
		switch {
		case !pr.Prefix:
			exact = append(exact, pr.Path)
		case pr.Path != "/" && pr.Action != enforce.ActionAllow && pr.Ops&backstoprules.OpRead != 0:
			prefixes = append(prefixes, pr.Path)
		}
	}
	var out []string
	for _, d := range enforce.WatchDirs(exact, prefixes, maxInodeWatchDirs) {
		own := false
		for _, s := range skip {
			s = strings.TrimSuffix(s, "/")
			own = own || d == s || strings.HasPrefix(d, s+"/")
		}
		if !own {
			out = append(out, d)
		}
	}
	return out
}

// ownFiles are the agent's files and directories (never watched).
func (a *Agent) ownFiles() []string {
	a.mu.Lock()
	pol := a.pol
	a.mu.Unlock()
	if pol == nil {
		return nil
	}
	return agentFiles(pol, a.opts.PolicyPath)
}

// followInodes writes the file rules again after each burst of changes in
// the watched directories, until the watch is closed.
func (a *Agent) followInodes() {
	for {
		changed, err := a.inodes.next()
		if err != nil {
			return
		}
		if changed = a.withoutCanaryFixtures(changed); len(changed) == 0 {
			continue
		}
		a.applyMu.Lock()
		a.mu.Lock()
		p := a.plan
		a.mu.Unlock()
		err = nil
		if a.lsm.LSM != nil {
			for id, r := range p.LSM {
				if e := a.lsm.SetRules(id, r); e != nil && err == nil {
					err = e
				}
			}
		}
		if a.backstop.Backstop != nil && err == nil {
			err = a.backstop.SetRules(p.Backstop)
		}
		a.inodes.set(inodeWatchDirs(p, a.ownFiles()))
		a.applyMu.Unlock()
		ev := audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded,
			Message: "file rules written again, inode entries follow the files, after changes to " + strings.Join(changed, ", ")}
		if err != nil {
			ev.Severity = audit.SeverityAlert
			ev.Message = "file rules could not follow changes to " + strings.Join(changed, ", ") + ": " + err.Error()
		}
		a.emit(ev)
	}
}
