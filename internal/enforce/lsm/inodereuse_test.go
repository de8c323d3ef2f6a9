package lsm

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
)

// reuseInodeNumber creates files in dir until one gets inode number ino
// (freed by a file deleted there: ext4 and xfs hand it out again at once),
// renames it to dst and removes the others. False where the filesystem
// does not give the number back soon (tmpfs counts up).
func reuseInodeNumber(t *testing.T, dir string, ino uint64, dst string) bool {
	t.Helper()
	var made []string
	defer func() {
		for _, p := range made {
			os.Remove(p)
		}
	}()
	for i := 0; i < 20000; i++ {
		p := filepath.Join(dir, fmt.Sprintf(".reuse-%d", i))
		must(t, os.WriteFile(p, []byte("an unrelated file\n"), 0o644))
		var st unix.Stat_t
		must(t, unix.Stat(p, &st))
		if st.Ino == ino {
			must(t, os.Rename(p, dst))
			t.Logf("inode %d reused after %d files", ino, i+1)
			return true
		}
		made = append(made, p)
	}
	return false
}

// TestInodeEntryNamesTheFile: an lsm_inode_rules entry judges the file it
// was written for, not another file given the same inode number once that
// file is deleted (the workload battery's npm debug log judged by the
// agent-files rule). By the table itself, on whatever filesystem the test
// directory is (the guest's is tmpfs, which does not give numbers back
// soon): an entry with the file's number and another generation does not
// match; with its generation, or GenerationAny, it does (so the generation
// the agent reads is the one the kernel compares).
func TestInodeEntryNamesTheFile(t *testing.T) {
	eng, l := setup(t)
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	must(t, os.WriteFile(plain, []byte("plain\n"), 0o644))
	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{Paths: []lsmrules.PathRule{
		{Path: filepath.Join(dir, "unrelated"), Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 600}},
	}})
	id, err := enforce.IdentifyFile(plain, true)
	must(t, err)
	var sfs unix.Statfs_t
	must(t, unix.Statfs(dir, &sfs))
	t.Logf("%s: filesystem %#x, inode %d, generation %#x", plain, sfs.Type, id.Ino, id.Generation)

	m := l.maps.Maps["lsm_inode_rules"]
	key := lsmInoKey{SandboxId: sb.sid, Dev: kernelDev(id.Dev), Ino: id.Ino}
	block := lsmAccessRule{ReadAction: enforce.ActionBlock, ReadRule: 601, WriteAction: enforce.ActionBlock, WriteRule: 601}
	open := []opSpec{{Name: "open", Kind: "open", Path: plain}}
	type genCase struct {
		name string
		gen  uint32
		want string
	}
	cases := []genCase{{"generation_any", enforce.GenerationAny, "EPERM"}}
	if id.Generation != enforce.GenerationAny {
		another := id.Generation + 1
		if another == enforce.GenerationAny {
			another++
		}
		cases = append(cases, genCase{"another_files_generation", another, "OK"},
			genCase{"its_generation", id.Generation, "EPERM"})
	} else {
		t.Logf("no generation readable on filesystem %#x: entries there match by number alone", sfs.Type)
	}
	for _, c := range cases {
		must(t, m.Put(key, lsmInoRule{Rule: block, Generation: c.gen}))
		res, pid := runOps(t, sb.root, open)
		if res["open"] != c.want {
			t.Errorf("%s: open of the file an entry's number names: %s, want %s", c.name, res["open"], c.want)
		}
		if c.want == "EPERM" {
			ev := waitEvent(t, c.name, func(ev audit.Event) bool {
				return ev.Process.TGID == uint32(pid) && ev.Kind == audit.KindFileOpen && ev.Rule == "rule-601"
			})
			if ev.Kind != "" && ev.Message != "matched by inode rule" {
				t.Errorf("%s: %q, want the inode rule", c.name, ev.Message)
			}
		} else if evs := eventsFrom(pid); len(evs) > 0 {
			t.Errorf("%s: events %+v", c.name, evs)
		}
	}
	must(t, m.Delete(key))
}

// TestInodeReuseNotJudged: real reuse, where the filesystem gives numbers
// back (ext4, xfs): a file below a protected directory and a protected
// file are deleted, new files get their numbers and are opened in the
// sandbox; hard links to the protected files are still refused, also
// after a reload with the protected file written again.
func TestInodeReuseNotJudged(t *testing.T) {
	eng, l := setup(t)
	dir := t.TempDir()
	var sfs unix.Statfs_t
	must(t, unix.Statfs(dir, &sfs))
	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{})
	ledger := filepath.Join(dir, "ledger")
	keyDir := filepath.Join(dir, "keys")
	elsewhere := filepath.Join(dir, "elsewhere")
	for _, d := range []string{ledger, keyDir, elsewhere} {
		must(t, os.Mkdir(d, 0o755))
	}
	seg, keep, keyFile := filepath.Join(ledger, "seg-1"), filepath.Join(ledger, "seg-2"), filepath.Join(keyDir, "agent.key")
	for _, p := range []string{seg, keep, keyFile} {
		must(t, os.WriteFile(p, []byte("protected\n"), 0o600))
	}
	rules := lsmrules.Rules{Paths: []lsmrules.PathRule{
		{Path: ledger + "/", Prefix: true, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 602}},
		{Path: keyFile, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 603}},
	}}
	must(t, l.SetRules(sb.sid, rules))
	keepLink, keyLink := filepath.Join(elsewhere, "keep-link"), filepath.Join(elsewhere, "key-link")
	must(t, os.Link(keep, keepLink))
	var segSt, keySt unix.Stat_t
	must(t, unix.Stat(seg, &segSt))
	must(t, unix.Stat(keyFile, &keySt))
	must(t, os.Remove(seg))
	must(t, os.Remove(keyFile))
	npmLog, other := filepath.Join(elsewhere, "debug-0.log"), filepath.Join(elsewhere, "other")
	if !reuseInodeNumber(t, ledger, segSt.Ino, npmLog) || !reuseInodeNumber(t, keyDir, keySt.Ino, other) {
		t.Skipf("filesystem %#x does not give inode numbers back soon: TestInodeEntryNamesTheFile stands for this test here", sfs.Type)
	}
	check := func(when string, extra ...opSpec) {
		ops := append([]opSpec{
			{Name: "reused_seg", Kind: "open", Path: npmLog},
			{Name: "reused_key", Kind: "open", Path: other},
			{Name: "keep_link", Kind: "open", Path: keepLink},
			{Name: "keep", Kind: "open", Path: keep},
		}, extra...)
		want := map[string]string{"reused_seg": "OK", "reused_key": "OK", "keep_link": "EPERM", "keep": "EPERM", "key_link": "EPERM"}
		res, _ := runOps(t, sb.root, ops)
		for _, op := range ops {
			if res[op.Name] != want[op.Name] {
				t.Errorf("%s: %s (%s): %s, want %s", when, op.Name, op.Path, res[op.Name], want[op.Name])
			}
		}
	}
	check("before the reload")
	// The key file written again, the rules with it: its hard link is
	// judged by its new entry, the reused numbers still are not.
	must(t, os.WriteFile(keyFile, []byte("protected again\n"), 0o600))
	must(t, l.SetRules(sb.sid, rules))
	must(t, os.Link(keyFile, keyLink))
	check("after the reload", opSpec{Name: "key_link", Kind: "open", Path: keyLink})
}
