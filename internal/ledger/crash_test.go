package ledger

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The crash writer runs in a child process (this test binary re-executed):
// it appends as fast as it can and prints "ack RUN N" whenever the first N
// of its events are acknowledged (Durable() covers them). With TORN set it
// also leaves a half-written record behind, as a write cut short by the
// kill would, before waiting to be killed.
const crashEnv = "WATCHER_LEDGER_CRASH_WRITER"

func TestCrashWriterProcess(t *testing.T) {
	spec := os.Getenv(crashEnv)
	if spec == "" {
		t.Skip("helper process for TestCrashRecovery")
	}
	parts := strings.Split(spec, ",")
	dir, run, torn := parts[0], parts[1], parts[2] == "1"
	l, err := Open(dir, Options{SyncInterval: 2 * time.Millisecond, BufferBytes: 64 << 10, CheckpointEvery: 5000,
		SegmentMaxBytes: 4 << 20, Compress: true})
	if err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(3)
	}
	out := bufio.NewWriter(os.Stdout)
	var seqs []uint64
	acked := 0
	for i := 0; ; i++ {
		e := testEvent(i, i%97 == 0)
		e.Message = fmt.Sprintf("crash-%s-%d", run, i)
		seq, _, err := l.Append(e)
		if err != nil {
			fmt.Printf("error %v\n", err)
			os.Exit(3)
		}
		seqs = append(seqs, seq)
		if i%512 == 511 {
			// Keep the ledger small enough to re-read quickly in every
			// round; appends still run in bursts at full speed.
			time.Sleep(time.Millisecond)
		}
		if i%256 == 0 {
			d := l.Durable()
			n := sort.Search(len(seqs), func(j int) bool { return seqs[j] >= d })
			if n > acked {
				acked = n
				fmt.Fprintf(out, "ack %s %d\n", run, n)
				out.Flush()
			}
		}
		if torn && i == 20000 {
			if err := l.Sync(); err != nil {
				os.Exit(3)
			}
			// Hold off rotation so the torn bytes stay at the tail.
			l.syncMu.Lock()
			seg := filepath.Join(dir, l.segName)
			f, err := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				os.Exit(3)
			}
			f.Write([]byte(`{"seq":99999999,"prev":"00000000`))
			f.Close()
			fmt.Fprintf(out, "ack %s %d\ntorn\n", run, len(seqs))
			out.Flush()
			// Wait for SIGKILL. Not select{}: with syncMu held the
			// committer blocks too, and the runtime would abort this
			// process with "all goroutines are asleep - deadlock!" (on
			// stderr, shared with the parent) if the kill came late.
			for {
				time.Sleep(time.Hour)
			}
		}
	}
}

func TestCrashRecovery(t *testing.T) {
	dir := t.TempDir()
	acked := map[int]int{}
	rng := rand.New(rand.NewPCG(7, 7))
	const runs = 8
	cuts := 0
	for run := 0; run < runs; run++ {
		torn := run%3 == 1
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashWriterProcess$", "-test.v")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%s", crashEnv, dir, run, map[bool]string{true: "1", false: "0"}[torn]))
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		// The kill timer starts once the writer is running (first ack).
		var deadline <-chan time.Time
		killAfter := time.Duration(30+rng.IntN(150)) * time.Millisecond
		sawTorn := false
	wait:
		for {
			select {
			case ln, ok := <-lines:
				if !ok {
					break wait
				}
				f := strings.Fields(ln)
				switch {
				case len(f) == 3 && f[0] == "ack":
					n, _ := strconv.Atoi(f[2])
					acked[run] = n
					if deadline == nil {
						deadline = time.After(killAfter)
					}
				case ln == "torn":
					sawTorn = true
					break wait
				case f[0] == "error":
					t.Fatalf("writer: %s", ln)
				}
			case <-deadline:
				if !torn {
					break wait
				}
			}
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		for ln := range lines {
			if f := strings.Fields(ln); len(f) == 3 && f[0] == "ack" {
				n, _ := strconv.Atoi(f[2])
				acked[run] = n
			}
		}
		if torn && !sawTorn {
			t.Fatalf("run %d: writer never reached the torn write", run)
		}
		// Independently of the ledger code: does the active segment end
		// mid-record?
		segs, _ := filepath.Glob(filepath.Join(dir, "seg-*.jsonl"))
		sort.Strings(segs)
		data, err := os.ReadFile(segs[len(segs)-1])
		if err != nil {
			t.Fatal(err)
		}
		tornTail := len(data) > 0 && data[len(data)-1] != '\n'
		if torn && !tornTail {
			t.Fatalf("run %d: torn write not at the tail", run)
		}
		before, _ := scanCrashLedger(t, dir)
		l, err := Open(dir, Options{Compress: true})
		if err != nil {
			t.Fatalf("run %d: reopen: %v", run, err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		after, got := scanCrashLedger(t, dir)
		if tornTail {
			cuts++
			if after != before+1 {
				t.Fatalf("run %d: tail was torn but %d recovery records were added", run, after-before)
			}
		} else if after != before {
			t.Fatalf("run %d: clean tail but the recovery records went from %d to %d", run, before, after)
		}
		rep := requireClean(t, dir)
		// No acknowledged record is missing, for this run or any before.
		for rn := 0; rn <= run; rn++ {
			is := got[rn]
			for j, i := range is {
				if i != j {
					t.Fatalf("run %d: event %d found where %d belongs (gap or reorder)", rn, i, j)
				}
			}
			if len(is) < acked[rn] {
				t.Fatalf("run %d: %d events acknowledged, only %d in the ledger", rn, acked[rn], len(is))
			}
		}
		t.Logf("run %d: acked %d, kept %d, torn tail %v, ledger %d records", run, acked[run], len(got[run]), tornTail, rep.Records)
		if acked[run] == 0 {
			t.Fatalf("run %d: writer acknowledged nothing", run)
		}
	}
	if cuts == 0 {
		t.Fatal("no run left a torn tail")
	}
}

// scanCrashLedger reads the segments' lines directly (the records were
// just verified) and returns the number of recovery records and, per run,
// the event numbers in ledger order.
func scanCrashLedger(t *testing.T, dir string) (recoveries int, events map[int][]int) {
	events = map[int][]int{}
	for _, seg := range segFiles(t, dir) {
		// A writer killed while rotating can leave a temporary file, or a
		// compressed copy beside its plain original (Open removes it):
		// count each segment once, from the original.
		if strings.HasSuffix(seg, tmpSuffix) {
			continue
		}
		if plain, ok := strings.CutSuffix(seg, zstSuffix); ok {
			if _, err := os.Stat(plain); err == nil {
				continue
			}
		}
		r, _, closeFn, err := openSegment(seg, strings.HasSuffix(seg, zstSuffix))
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(r)
		closeFn()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range bytes.Split(data, []byte("\n")) {
			if bytes.Contains(line, []byte(`"kind":"recovery"`)) {
				recoveries++
			}
			i := bytes.Index(line, []byte(`"message":"crash-`))
			if i < 0 {
				continue
			}
			var rn, n int
			if _, err := fmt.Sscanf(string(line[i+len(`"message":"crash-`):]), "%d-%d", &rn, &n); err == nil {
				events[rn] = append(events[rn], n)
			}
		}
	}
	return recoveries, events
}
