package containers_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/containers"
	"github.com/watcherhq/watcher/internal/testkit/dockertest"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// TestLabelTargets: a real dockerd's containers selected by their labels
// (the labels kubelet puts on a Kubernetes container, set here by hand):
// the matching container's cgroup is reported as it starts, one of
// another namespace is not, and it is reported gone when removed. The log
// gives the gap between the container's start and the match.
func TestLabelTargets(t *testing.T) {
	d := dockertest.Start(t)
	image := d.BusyboxImage(t)
	var mu sync.Mutex
	var events []containers.Event
	at := map[string]time.Time{}
	var errs []error
	w, err := containers.NewWatcher(containers.WatcherConfig{
		Targets: []containers.Target{{Name: "agents", Labels: map[string]string{"io.kubernetes.pod.namespace": "agents", "app": "*"}}},
		Labels:  &containers.DockerLabels{Socket: d.Socket},
		OnError: func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() },
		OnEvent: func(ev containers.Event) {
			mu.Lock()
			events = append(events, ev)
			at[string(ev.Op)+ev.Info.ContainerID] = time.Now()
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	time.Sleep(200 * time.Millisecond) // the watches are in place

	other := d.Run(t, "--network", "none", "--label", "io.kubernetes.pod.namespace=other", "--label", "app=coder", image, "/bin/sleep", "1000")
	match := d.Run(t, "--network", "none", "--label", "io.kubernetes.pod.namespace=agents", "--label", "app=coder", image, "/bin/sleep", "1000")
	waitUntil(t, "the labelled container reported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := at[string(containers.Appeared)+match.ID]
		return ok
	})
	started, err := time.Parse(time.RFC3339Nano, d.Docker(t, "inspect", "-f", "{{.State.StartedAt}}", match.ID))
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	gap := at[string(containers.Appeared)+match.ID].Sub(started)
	mu.Unlock()
	t.Logf("label match %v after docker's StartedAt (negative: before the container's program started)", gap)

	d.Docker(t, "rm", "-f", match.ID)
	waitUntil(t, "the removed container reported gone", func() bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := at[string(containers.Gone)+match.ID]
		return ok
	})
	mu.Lock()
	defer mu.Unlock()
	for _, ev := range events {
		if ev.Info.ContainerID == other.ID {
			t.Errorf("container of namespace other matched: %+v", ev)
		}
		if ev.Target != "agents" {
			t.Errorf("event for target %q", ev.Target)
		}
	}
	if len(errs) > 0 {
		t.Errorf("label lookups failed: %v", errs)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Eventually(t, 30*time.Second, cond, "timed out waiting for %s", what)
}
