package canary

import (
	"errors"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReadRetryEINTR: a socket read with a receive timeout fails with
// EINTR whenever a signal handler runs on its thread (signal(7): never
// restarted), and the Go runtime signals its threads. The probe's read
// goes on to its deadline: signals hit the reading thread for 300 ms, the
// answer comes after them.
func TestReadRetryEINTR(t *testing.T) {
	srv, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	sa, _ := sockaddr(srv.LocalAddr().String())
	if err := unix.Connect(fd, sa); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(fd, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	_, from, err := srv.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}

	for _, retry := range []bool{false, true} {
		var tid atomic.Int32
		var stop atomic.Bool
		done := make(chan struct{})
		go func() {
			defer close(done)
			for tid.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			end := time.Now().Add(300 * time.Millisecond)
			for time.Now().Before(end) && !stop.Load() {
				// SIGURG: the runtime's own preemption signal, handled
				// (with SA_RESTART) and otherwise ignored.
				unix.Tgkill(unix.Getpid(), int(tid.Load()), unix.SIGURG)
				time.Sleep(2 * time.Millisecond)
			}
			srv.WriteTo([]byte("pong"), from)
		}()
		n, err := func() (int, error) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			tid.Store(int32(unix.Gettid()))
			deadline := time.Now().Add(probeTimeout)
			if retry {
				return readRetry(fd, buf, deadline)
			}
			tv := unix.NsecToTimeval(probeTimeout.Nanoseconds())
			unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
			return unix.Read(fd, buf)
		}()
		stop.Store(true)
		<-done
		n = max(n, 0)
		if !retry {
			// The premise: a plain read fails. The answer the sender
			// sent after the signals is read before the next round.
			t.Logf("a plain read under signals: %q, %v", buf[:n], err)
			if errors.Is(err, unix.EINTR) {
				readRetry(fd, buf, time.Now().Add(probeTimeout))
			}
			continue
		}
		if err != nil || string(buf[:n]) != "pong" {
			t.Errorf("readRetry: %q, %v; want the answer sent after the signals", buf[:n], err)
		}
	}
}
