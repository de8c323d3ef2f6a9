package adversarial

// Class 4, by inode: the host (this test, standing for tools outside the
// sandbox) gives a protected file a new inode or another name, and the
// attacker reads it through that name. The agent must follow the files
// (internal/agent/inodewatch.go): each setup waits for the agent's record
// that it wrote the file rules again after the change.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// refreshMsg is what the agent records when the file rules follow a change.
const refreshMsg = "inode entries follow the files"

// refreshes counts the agent's records of rules written again after a
// change to path.
func (b *bed) refreshes(path string) int {
	data, _ := os.ReadFile(b.events)
	n := 0
	for _, line := range bytes.Split(data, []byte("\n")) {
		var e audit.Event
		if len(line) == 0 || json.Unmarshal(line, &e) != nil || e.Kind != audit.KindAgent || !strings.Contains(e.Message, refreshMsg) {
			continue
		}
		for _, p := range strings.Split(e.Message[strings.Index(e.Message, " after changes to ")+len(" after changes to "):], ", ") {
			if p == path {
				n++
			}
		}
	}
	return n
}

// hostChange runs change (which touches path) and waits until the agent
// recorded that its file rules followed it.
func (b *bed) hostChange(path string, change func()) {
	before := b.refreshes(path)
	change()
	if !poll.Within(20*time.Second, func() bool { return b.refreshes(path) > before }) {
		b.t.Errorf("the agent did not record following the change to %s\n%s", path, b.agentLog)
	}
}

func must(b *bed, err error) {
	if err != nil {
		b.t.Fatal(err)
	}
}

// lateFileHostLink: a file created below the protected prefix after the
// agent started; a host tool gives it a second name in the workspace.
func lateFileHostLink(b *bed) string {
	b.leafSeq++
	f := filepath.Join(b.secretDir, fmt.Sprintf("late-%d", b.leafSeq))
	b.hostChange(f, func() { must(b, os.WriteFile(f, []byte(secretContent+"-late\n"), 0o600)) })
	l := filepath.Join(b.ws, fmt.Sprintf("host-link-%d", b.leafSeq))
	must(b, os.Link(f, l))
	return l
}

// movedInEarlierLink: a file the attacker linked while it was harmless
// (in its workspace) is renamed over a protected file by the host.
func movedInEarlierLink(b *bed) string {
	b.leafSeq++
	draft := filepath.Join(b.ws, fmt.Sprintf("draft-%d", b.leafSeq))
	early := draft + "-early-link"
	must(b, os.WriteFile(draft, []byte(secretContent+"-moved-in\n"), 0o600))
	must(b, os.Link(draft, early))
	dst := filepath.Join(b.secretDir, "key3")
	b.hostChange(dst, func() { must(b, os.Rename(draft, dst)) })
	return early
}

// exactReplacedPasswd: the file of an exact rule is replaced as passwd
// does (write shadow+, rename over shadow); the new file has another name
// the rules do not list (a link a host tool made).
func exactReplacedPasswd(b *bed) string {
	b.leafSeq++
	tmp := b.shadow + "+"
	must(b, os.WriteFile(tmp, []byte(secretContent+"-shadow-new\n"), 0o600))
	l := filepath.Join(b.ws, fmt.Sprintf("shadow-link-%d", b.leafSeq))
	must(b, os.Link(tmp, l))
	b.hostChange(b.shadow, func() { must(b, os.Rename(tmp, b.shadow)) })
	return l
}

// readArg reads the name the setup gave (ADV_ARG).
func readArg(e attackEnv, _ string) error { return readAndPrint(os.Getenv("ADV_ARG")) }

func init() {
	for _, n := range []string{"late-file-host-link", "moved-in-earlier-link", "exact-replaced-passwd"} {
		attacks[n] = readArg
	}
}
