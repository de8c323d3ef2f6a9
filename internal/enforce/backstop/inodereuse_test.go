package backstop_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// Rule ids of the reuse tests.
const (
	reuseDirID = 91 // prefix rule on a directory (the agent's ledger)
	reuseKeyID = 92 // exact rule on a file (the agent's key file)
)

func inoOf(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// reuseInode creates files in dir until one gets inode number ino (the
// number of a file deleted there; ext4 and xfs hand freed numbers out
// again at once, lowest first in the directory's group), moves it to
// dst and removes the others. It skips the test where the filesystem
// does not give the number back soon (tmpfs counts up, btrfs too).
func reuseInode(t *testing.T, dir string, ino uint64, dst string) {
	t.Helper()
	var made []string
	defer func() {
		for _, p := range made {
			os.Remove(p)
		}
	}()
	for i := 0; i < 20000; i++ {
		p := filepath.Join(dir, fmt.Sprintf(".reuse-%d", i))
		if err := os.WriteFile(p, []byte("an unrelated file\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if inoOf(t, p) == ino {
			if err := os.Rename(p, dst); err != nil {
				t.Fatal(err)
			}
			t.Logf("inode %d reused after %d files", ino, i+1)
			return
		}
		made = append(made, p)
	}
	var sfs syscall.Statfs_t
	syscall.Statfs(dir, &sfs)
	t.Skipf("inode %d not reused after %d files in %s (filesystem magic %#x)", ino, len(made), dir, sfs.Type)
}

// sandboxed runs name with args in a fresh leaf of the fixture's sandbox
// and reports whether it was killed, with the events of its pid.
func (f *fixture) sandboxed(t *testing.T, name string, args ...string) (killed bool, out string, evs []audit.Event) {
	t.Helper()
	cmd := enforcetest.Command(t, f.leaf(t, f.sandbox), name, args...)
	b, _ := cmd.CombinedOutput()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		killed = true
	}
	// Events travel through a ring buffer polled every 10ms.
	time.Sleep(100 * time.Millisecond)
	return killed, string(b), f.eventsOf(cmd.Process.Pid)
}

func describeEvents(evs []audit.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		path := ""
		if ev.File != nil {
			path = ev.File.Path
		}
		fmt.Fprintf(&b, "[%s %s rule %d %s] ", ev.Kind, ev.Verdict, ev.RuleID, path)
	}
	return b.String()
}

// TestInodeReuseNotJudged: inode entries (hard links, other names of a
// protected file) are written for the files as they are when the rules
// are set. A protected file deleted afterwards (a ledger segment
// compressed and removed, a key file replaced) leaves its entry until
// the next reload; ext4 hands the freed inode number to the next file
// created nearby. That new, unrelated file must not be judged by the old
// rule (workload battery: npm's debug log recorded as agent-files), by
// opens (bs_inode_rules) or by changes (bs_dirs), while the protected
// files and their hard links still are, and a file recreated at a
// protected path is protected by inode again after a reload.
func TestInodeReuseNotJudged(t *testing.T) {
	enforcetest.RequireRoot(t)
	base := t.TempDir()
	ledger := filepath.Join(base, "ledger")
	seg := filepath.Join(ledger, "seg-0001")
	keep := filepath.Join(ledger, "seg-0002")
	keyDir := filepath.Join(base, "keys")
	key := filepath.Join(keyDir, "agent.key")
	elsewhere := filepath.Join(base, "elsewhere") // no rule
	for _, d := range []string{ledger, keyDir, elsewhere} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{seg, keep, key} {
		if err := os.WriteFile(p, []byte("protected\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if id, err := enforce.IdentifyFile(seg, true); err != nil || id.Generation == enforce.GenerationAny {
		// Entries there match by number alone, as documented.
		t.Skipf("no inode generation readable under %s (%v)", base, err)
	}
	rw := backstoprules.OpRead | backstoprules.OpWrite
	kill := func(id uint32) backstoprules.Rule { return backstoprules.Rule{Action: enforce.ActionKill, ID: id} }
	f := newFixture(t, func(r *backstoprules.Rules) {
		r.Paths = append(r.Paths,
			backstoprules.PathRule{Path: ledger + "/", Prefix: true, Ops: rw, Rule: kill(reuseDirID)},
			backstoprules.PathRule{Path: ledger, Ops: rw, Rule: kill(reuseDirID)},
			backstoprules.PathRule{Path: key, Ops: rw, Rule: kill(reuseKeyID)})
	})
	_, ctimeMissing := f.bs.Missing()[backstop.ProgCtimeSet]

	// Hard links made after the rules were set, outside every rule: the
	// inode entries judge them.
	keepLink := filepath.Join(elsewhere, "keep-link")
	keyLink := filepath.Join(elsewhere, "key-link")
	if err := os.Link(keep, keepLink); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(key, keyLink); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		id   uint32
	}{{keepLink, reuseDirID}, {keyLink, reuseKeyID}} {
		killed, out, evs := f.sandboxed(t, "/bin/cat", c.path)
		if !killed || len(evs) == 0 || evs[0].RuleID != c.id {
			t.Fatalf("cat %s (hard link to a protected file): killed=%v events %s, want killed by rule %d\n%s",
				c.path, killed, describeEvents(evs), c.id, out)
		}
	}
	os.Remove(keyLink)

	// The protected files go away; new files take their numbers.
	segIno, keyIno := inoOf(t, seg), inoOf(t, key)
	if err := os.Remove(seg); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(key); err != nil {
		t.Fatal(err)
	}
	npmLog := filepath.Join(elsewhere, "debug-0.log")
	other := filepath.Join(elsewhere, "other")
	reuseInode(t, ledger, segIno, npmLog)
	reuseInode(t, keyDir, keyIno, other)

	check := func(t *testing.T) {
		t.Helper()
		for _, p := range []string{npmLog, other} {
			killed, out, evs := f.sandboxed(t, "/bin/cat", p)
			if killed || len(evs) > 0 || !strings.Contains(out, "unrelated") {
				t.Errorf("cat %s (a new file reusing a protected file's inode number): killed=%v events %s\n%s",
					p, killed, describeEvents(evs), out)
			}
		}
		if !ctimeMissing {
			// A change judged by inode (bs_dirs: the key file's entry).
			killed, out, evs := f.sandboxed(t, "/bin/chmod", "0600", other)
			if killed || len(evs) > 0 {
				t.Errorf("chmod %s (a new file reusing a protected file's inode number): killed=%v events %s\n%s",
					other, killed, describeEvents(evs), out)
			}
		}
		// Still protected: the other file of the directory, by its hard
		// link (inode entry) and by path.
		for _, p := range []string{keepLink, keep} {
			killed, out, evs := f.sandboxed(t, "/bin/cat", p)
			if !killed || len(evs) == 0 || evs[0].RuleID != reuseDirID {
				t.Errorf("cat %s: killed=%v events %s, want killed by rule %d\n%s", p, killed, describeEvents(evs), reuseDirID, out)
			}
		}
	}
	t.Run("before_reload", check)

	// The key file is written again (a new inode); a reload writes its
	// entry: a hard link to it is judged again, the reused numbers still
	// are not.
	if err := os.WriteFile(key, []byte("protected again\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.bs.SetRules(f.rules); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(key, keyLink); err != nil {
		t.Fatal(err)
	}
	t.Run("after_reload", func(t *testing.T) {
		check(t)
		killed, out, evs := f.sandboxed(t, "/bin/cat", keyLink)
		if !killed || len(evs) == 0 || evs[0].RuleID != reuseKeyID {
			t.Errorf("cat %s (hard link to the recreated key file): killed=%v events %s, want killed by rule %d\n%s",
				keyLink, killed, describeEvents(evs), reuseKeyID, out)
		}
	})
}

// TestInodeEntryTmpfs: on tmpfs (/dev/shm, /run, a test's /tmp) the
// generation the agent reads from the file handle is the one the programs
// compare: hard links to a protected file, and to a file below a
// protected directory, are still judged by their inode entries.
func TestInodeEntryTmpfs(t *testing.T) {
	enforcetest.RequireRoot(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	prot := filepath.Join(dir, "prot")
	if err := os.Mkdir(prot, 0o755); err != nil {
		t.Fatal(err)
	}
	below, key := filepath.Join(prot, "file"), filepath.Join(dir, "key")
	for _, p := range []string{below, key} {
		if err := os.WriteFile(p, []byte("protected\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rw := backstoprules.OpRead | backstoprules.OpWrite
	f := newFixture(t, func(r *backstoprules.Rules) {
		r.Paths = append(r.Paths,
			backstoprules.PathRule{Path: prot + "/", Prefix: true, Ops: rw, Rule: backstoprules.Rule{Action: enforce.ActionKill, ID: reuseDirID}},
			backstoprules.PathRule{Path: key, Ops: rw, Rule: backstoprules.Rule{Action: enforce.ActionKill, ID: reuseKeyID}})
	})
	for _, c := range []struct {
		target string
		id     uint32
	}{{below, reuseDirID}, {key, reuseKeyID}} {
		link := c.target + ".link"
		if c.target == below {
			link = filepath.Join(dir, "below.link")
		}
		if err := os.Link(c.target, link); err != nil {
			t.Fatal(err)
		}
		killed, out, evs := f.sandboxed(t, "/bin/cat", link)
		if !killed || len(evs) == 0 || evs[0].RuleID != c.id {
			t.Errorf("cat %s (hard link on tmpfs): killed=%v events %s, want killed by rule %d\n%s",
				link, killed, describeEvents(evs), c.id, out)
		}
	}
}
