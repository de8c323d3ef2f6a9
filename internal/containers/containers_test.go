package containers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/cgroupfs"
)

func randHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)[:n]
}

func randUID(t *testing.T) string {
	h := randHex(t, 32)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// testRoot creates an empty cgroup below the real cgroup2 mount that stands
// for a host's hierarchy root, and removes it (and everything below) after
// the test.
func testRoot(t *testing.T) string {
	t.Helper()
	mnt, err := cgroupfs.Mountpoint()
	if errors.Is(err, cgroupfs.ErrNoCgroup2) {
		t.Skip("no cgroup2 hierarchy mounted on this machine")
	}
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(mnt, "watcher-test-"+randHex(t, 8))
	if err := os.Mkdir(root, 0o755); err != nil {
		if errors.Is(err, os.ErrPermission) {
			t.Skip("creating cgroups needs root")
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cgroupfs.Remove(root); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return root
}

func mkcg(t *testing.T, root, rel string) uint64 {
	t.Helper()
	abs := filepath.Join(root, rel)
	if err := os.MkdirAll(abs, 0o755); err != nil {
		t.Fatal(err)
	}
	id, err := cgroupfs.ID(abs)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestIdentify(t *testing.T) {
	id := strings.Repeat("ab12", 16)
	uid := "0f3c8a1e-5b2d-4c7e-9a10-77e2d4b6c801"
	uidU := strings.ReplaceAll(uid, "-", "_")
	cases := []struct {
		path string
		want Info
		ok   bool
	}{
		{"/system.slice/docker-" + id + ".scope", Info{Runtime: Docker, ContainerID: id, Driver: DriverSystemd}, true},
		{"/docker/" + id, Info{Runtime: Docker, ContainerID: id, Driver: DriverCgroupfs}, true},
		{"/default/" + id, Info{Runtime: Containerd, ContainerID: id, Driver: DriverCgroupfs, Namespace: "default"}, true},
		{"/system.slice/nerdctl-" + id + ".scope", Info{Runtime: Containerd, ContainerID: id, Driver: DriverSystemd}, true},
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/cri-containerd-" + id + ".scope",
			Info{Runtime: Containerd, ContainerID: id, PodUID: uid, QoS: QoSBurstable, Driver: DriverSystemd}, true},
		{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/crio-" + id + ".scope",
			Info{Runtime: CRIO, ContainerID: id, PodUID: uid, QoS: QoSBestEffort, Driver: DriverSystemd}, true},
		{"/kubepods.slice/kubepods-pod" + uidU + ".slice/docker-" + id + ".scope",
			Info{Runtime: Docker, ContainerID: id, PodUID: uid, QoS: QoSGuaranteed, Driver: DriverSystemd}, true},
		{"/kubepods.slice/kubepods-pod" + uidU + ".slice",
			Info{PodUID: uid, QoS: QoSGuaranteed, Driver: DriverSystemd}, true},
		{"/kubepods/burstable/pod" + uid + "/" + id,
			Info{ContainerID: id, PodUID: uid, QoS: QoSBurstable, Driver: DriverCgroupfs}, true},
		{"/kubepods/pod" + uid + "/crio-" + id,
			Info{Runtime: CRIO, ContainerID: id, PodUID: uid, QoS: QoSGuaranteed, Driver: DriverCgroupfs}, true},
		{"/kubepods/besteffort/pod" + uid,
			Info{PodUID: uid, QoS: QoSBestEffort, Driver: DriverCgroupfs}, true},
		// kind and k3s nodes put the kubelet's tree below another root.
		{"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod" + uidU + ".slice/cri-containerd-" + id + ".scope",
			Info{Runtime: Containerd, ContainerID: id, PodUID: uid, QoS: QoSBurstable, Driver: DriverSystemd}, true},
		// Not containers: conmon's scope, ordinary services, short names.
		{"/kubepods.slice/kubepods-pod" + uidU + ".slice/crio-conmon-" + id + ".scope", Info{}, false},
		{"/system.slice/ssh.service", Info{}, false},
		{"/docker/" + id[:12], Info{}, false},
		{"/a/b/" + id, Info{}, false},
		{"/", Info{}, false},
	}
	for _, c := range cases {
		got, ok := Identify(c.path)
		if ok != c.ok || got != c.want {
			t.Errorf("Identify(%s) = %+v, %v; want %+v, %v", c.path, got, ok, c.want, c.ok)
		}
	}
}

func TestParseRef(t *testing.T) {
	id := strings.Repeat("0123456789abcdef", 4)
	good := map[string]Ref{
		"docker://" + id:          {Runtime: Docker, ID: id},
		"containerd://" + id[:12]: {Runtime: Containerd, ID: id[:12]},
		"cri-o://" + id:           {Runtime: CRIO, ID: id},
		"crio://" + id:            {Runtime: CRIO, ID: id},
		"pod://0f3c8a1e-5b2d-4c7e-9a10-77e2d4b6c801": {ID: "0f3c8a1e-5b2d-4c7e-9a10-77e2d4b6c801", Pod: true},
	}
	for s, want := range good {
		got, err := ParseRef(s)
		if err != nil || got != want {
			t.Errorf("ParseRef(%q) = %+v, %v; want %+v", s, got, err, want)
		}
	}
	for _, s := range []string{id, "docker://" + id[:11], "docker://" + strings.ToUpper(id), "rkt://" + id, "docker://" + id + "0", "pod://nope"} {
		if _, err := ParseRef(s); err == nil {
			t.Errorf("ParseRef(%q) accepted", s)
		}
	}
}

func TestGlob(t *testing.T) {
	cases := []struct {
		pat, path string
		want      bool
	}{
		{"/kubepods.slice/**/cri-containerd-*.scope", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/cri-containerd-ab.scope", true},
		{"/kubepods.slice/**/cri-containerd-*.scope", "/kubepods.slice/cri-containerd-ab.scope", true},
		{"/kubepods.slice/**/cri-containerd-*.scope", "/system.slice/cri-containerd-ab.scope", false},
		{"/watcher/exec/*", "/watcher/exec/call-1", true},
		{"/watcher/exec/*", "/watcher/exec/call-1/child", false},
		{"/watcher/exec/*", "/watcher/exec", false},
		{"/**", "/anything/at/all", true},
		{"/a/**/b/**/c", "/a/x/b/y/z/c", true},
		{"/a/**/b/**/c", "/a/x/c", false},
	}
	for _, c := range cases {
		g, err := CompileGlob(c.pat)
		if err != nil {
			t.Fatalf("CompileGlob(%q): %v", c.pat, err)
		}
		if got := g.Match(c.path); got != c.want {
			t.Errorf("%q.Match(%q) = %v, want %v", c.pat, c.path, got, c.want)
		}
	}
	for _, bad := range []string{"relative/*", "/a/[x", "/a/b**", "/a/../b"} {
		if _, err := CompileGlob(bad); err == nil {
			t.Errorf("CompileGlob(%q) accepted", bad)
		}
	}
}

// layout is one host-like hierarchy built under a test root with each
// runtime's naming, both drivers and all QoS classes.
type layout struct {
	ref  Ref
	path string
}

func buildLayout(t *testing.T, root string) []layout {
	var ls []layout
	add := func(rt Runtime, pod bool, id, path string) {
		ls = append(ls, layout{Ref{Runtime: rt, ID: id, Pod: pod}, path})
		mkcg(t, root, path)
	}
	id := func() string { return randHex(t, 64) }
	uids := []string{randUID(t), randUID(t), randUID(t), randUID(t), randUID(t), randUID(t)}
	u := func(i int) string { return strings.ReplaceAll(uids[i], "-", "_") }

	d1, d2, c1, c2 := id(), id(), id(), id()
	add(Docker, false, d1, "/system.slice/docker-"+d1+".scope")
	add(Docker, false, d2, "/docker/"+d2)
	add(Containerd, false, c1, "/default/"+c1)
	add(Containerd, false, c2, "/system.slice/nerdctl-"+c2+".scope")

	// Kubernetes, systemd driver, each QoS class and runtime.
	k1, k2, k3 := id(), id(), id()
	add(Containerd, false, k1, "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+u(0)+".slice/cri-containerd-"+k1+".scope")
	add(CRIO, false, k2, "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"+u(1)+".slice/crio-"+k2+".scope")
	add(Docker, false, k3, "/kubepods.slice/kubepods-pod"+u(2)+".slice/docker-"+k3+".scope")
	// CRI-O's conmon scope beside the container must not be mistaken for it.
	mkcg(t, root, "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"+u(1)+".slice/crio-conmon-"+k2+".scope")
	add("", true, uids[0], "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+u(0)+".slice")
	add("", true, uids[2], "/kubepods.slice/kubepods-pod"+u(2)+".slice")

	// Kubernetes, cgroupfs driver.
	f1, f2, f3 := id(), id(), id()
	add(Containerd, false, f1, "/kubepods/burstable/pod"+uids[3]+"/"+f1)
	add(CRIO, false, f2, "/kubepods/pod"+uids[4]+"/crio-"+f2)
	add(Docker, false, f3, "/kubepods/besteffort/pod"+uids[5]+"/"+f3)
	add("", true, uids[4], "/kubepods/pod"+uids[4])
	add("", true, uids[5], "/kubepods/besteffort/pod"+uids[5])
	return ls
}

func TestResolveRealCgroups(t *testing.T) {
	root := testRoot(t)
	ls := buildLayout(t, root)
	r := &Resolver{Root: root}
	for _, l := range ls {
		m, err := r.Resolve(l.ref)
		if err != nil {
			t.Errorf("Resolve(%s): %v", l.ref, err)
			continue
		}
		want, _ := cgroupfs.ID(filepath.Join(root, l.path))
		if m.Path != l.path || m.ID != want || m.Abs != filepath.Join(root, l.path) {
			t.Errorf("Resolve(%s) = %s (id %d), want %s (id %d)", l.ref, m.Path, m.ID, l.path, want)
		}
		// A 12-digit prefix, as `docker ps` prints, resolves the same way.
		if !l.ref.Pod {
			short := Ref{Runtime: l.ref.Runtime, ID: l.ref.ID[:12]}
			if m2, err := r.Resolve(short); err != nil || m2.Path != l.path {
				t.Errorf("Resolve(%s) = %s, %v; want %s", short, m2.Path, err, l.path)
			}
		}
	}
	// The wrong runtime for an id does not resolve.
	crio := ls[5]
	if crio.ref.Runtime != CRIO {
		t.Fatalf("layout order changed: %v", crio.ref)
	}
	if _, err := r.Resolve(Ref{Runtime: Docker, ID: crio.ref.ID}); !errors.Is(err, ErrNotFound) {
		t.Errorf("docker:// of a CRI-O container: %v, want ErrNotFound", err)
	}
	if _, err := r.Resolve(Ref{Runtime: Docker, ID: randHex(t, 64)}); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown id: %v, want ErrNotFound", err)
	}
	// Two containers sharing a 12-digit prefix make that prefix ambiguous.
	a := "feedfacecafe" + randHex(t, 52)
	b := "feedfacecafe" + randHex(t, 52)
	mkcg(t, root, "/system.slice/docker-"+a+".scope")
	mkcg(t, root, "/docker/"+b)
	if _, err := r.Resolve(Ref{Runtime: Docker, ID: "feedfacecafe"}); err == nil || !strings.Contains(err.Error(), "ambiguous") {
		t.Errorf("ambiguous prefix: %v", err)
	}
	if m, err := r.Resolve(Ref{Runtime: Docker, ID: b}); err != nil || m.Path != "/docker/"+b {
		t.Errorf("full id next to a shared prefix: %v %v", m.Path, err)
	}

	g, _ := CompileGlob("/kubepods.slice/**/cri-containerd-*.scope")
	ms, err := r.Glob(g)
	if err != nil || len(ms) != 1 || ms[0].Info.Runtime != Containerd {
		t.Errorf("Glob: %+v, %v", ms, err)
	}
}

type recorder struct {
	ch chan Event
}

func newRecorder() *recorder { return &recorder{ch: make(chan Event, 1024)} }

func (r *recorder) on(ev Event) { r.ch <- ev }

// wait returns the next event or fails after a generous deadline (a missed
// notification shows up as a failure, not a hang).
func (r *recorder) wait(t *testing.T, what string) Event {
	t.Helper()
	select {
	case ev := <-r.ch:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatalf("no watcher event: %s", what)
	}
	return Event{}
}

func (r *recorder) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case ev := <-r.ch:
		t.Fatalf("unexpected watcher event %+v", ev)
	case <-time.After(d):
	}
}

func TestWatcherNoticesCgroupsAppearingLater(t *testing.T) {
	root := testRoot(t)
	existing := randHex(t, 64)
	mkcg(t, root, "/system.slice/docker-"+existing+".scope")
	mkcg(t, root, "/system.slice/ssh.service")

	glob, _ := CompileGlob("/kubepods.slice/**/cri-containerd-*.scope")
	later := randHex(t, 64)
	dockerRef := Ref{Runtime: Docker, ID: later[:12]}
	existingRef := Ref{Runtime: Docker, ID: existing}
	rec := newRecorder()
	w, err := NewWatcher(WatcherConfig{
		Root: root,
		Targets: []Target{
			{Name: "k8s", Glob: glob},
			{Name: "agent", Ref: &dockerRef},
			{Name: "old", Ref: &existingRef},
		},
		// A long rescan period: events must come from inotify.
		Rescan:  time.Hour,
		OnEvent: rec.on,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()

	ev := rec.wait(t, "existing container")
	if ev.Op != Appeared || ev.Target != "old" || ev.Info.ContainerID != existing {
		t.Fatalf("first event %+v, want the existing docker container", ev)
	}

	// A pod and its container created in one go, as a runtime does.
	uid := randUID(t)
	cid := randHex(t, 64)
	podPath := "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"
	ctrPath := podPath + "/cri-containerd-" + cid + ".scope"
	wantID := mkcg(t, root, ctrPath)
	ev = rec.wait(t, "new kubernetes container")
	if ev.Op != Appeared || ev.Target != "k8s" || ev.Path != ctrPath || ev.ID != wantID ||
		ev.Info.PodUID != uid || ev.Info.QoS != QoSBurstable || ev.Info.ContainerID != cid {
		t.Fatalf("event %+v, want %s (id %d) in pod %s", ev, ctrPath, wantID, uid)
	}

	// A docker container with the referenced id, cgroupfs driver.
	dockerPath := "/docker/" + later
	wantID = mkcg(t, root, dockerPath)
	ev = rec.wait(t, "docker container by short id")
	if ev.Op != Appeared || ev.Target != "agent" || ev.Path != dockerPath || ev.ID != wantID {
		t.Fatalf("event %+v, want %s", ev, dockerPath)
	}

	// Unrelated cgroups make no events.
	mkcg(t, root, "/system.slice/cron.service")
	mkcg(t, root, "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+strings.ReplaceAll(randUID(t), "-", "_")+".slice/crio-"+randHex(t, 64)+".scope")
	rec.none(t, 300*time.Millisecond)

	// Removal is reported.
	if err := cgroupfs.Remove(filepath.Join(root, podPath)); err != nil {
		t.Fatal(err)
	}
	ev = rec.wait(t, "removed container")
	if ev.Op != Gone || ev.Path != ctrPath {
		t.Fatalf("event %+v, want %s gone", ev, ctrPath)
	}

	// New targets take effect without restart: existing matches appear,
	// dropped targets' matches go.
	crioGlob, _ := CompileGlob("/kubepods.slice/**/crio-*.scope")
	if err := w.SetTargets([]Target{{Name: "crio", Glob: crioGlob}, {Name: "agent", Ref: &dockerRef}}); err != nil {
		t.Fatal(err)
	}
	got := map[string]Op{}
	for i := 0; i < 2; i++ {
		ev := rec.wait(t, "after SetTargets")
		got[fmt.Sprintf("%s %s", ev.Target, ev.Op)] = ev.Op
	}
	if _, ok := got["crio appeared"]; !ok {
		t.Errorf("after SetTargets: %v, want the CRI-O container to appear", got)
	}
	if _, ok := got["old gone"]; !ok {
		t.Errorf("after SetTargets: %v, want the dropped target's container gone", got)
	}
	rec.none(t, 200*time.Millisecond)
}

func TestWatcherRejectsBadTargets(t *testing.T) {
	g, _ := CompileGlob("/x/*")
	ref := Ref{Runtime: Docker, ID: randHex(t, 12)}
	if _, err := NewWatcher(WatcherConfig{Root: "/nonexistent", Targets: []Target{{Name: "both", Glob: g, Ref: &ref}}, OnEvent: func(Event) {}}); err == nil {
		t.Error("target with both glob and ref accepted")
	}
	if _, err := NewWatcher(WatcherConfig{Root: "/nonexistent", Targets: []Target{{Name: "none"}}, OnEvent: func(Event) {}}); err == nil {
		t.Error("target with neither accepted")
	}
	if _, err := NewWatcher(WatcherConfig{Root: "/nonexistent"}); err == nil {
		t.Error("watcher without OnEvent accepted")
	}
}
