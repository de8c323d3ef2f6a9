package canary

import (
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/launch"
)

// envProbe carries the probe's spec to the re-executed binary; envWait
// says it waits for a byte on waitFD before it acts (runtime placement:
// the runner moves it into the leaf first).
const (
	envProbe = "WATCHER_CANARY_PROBE"
	envWait  = "WATCHER_CANARY_WAIT"
	waitFD   = 3
	readyFD  = 4
)

// probeArg0 is the probe's argv[0], so `ps` says what it is.
const probeArg0 = "watcher-canary-probe"

// probeSpec is one probe's operation.
type probeSpec struct {
	Op     string `json:"op"`
	Target string `json:"target,omitempty"`
	PID    int    `json:"pid,omitempty"`
}

// probeResult is what a probe reports on stdout (one JSON line). A probe
// killed by the backstop reports nothing.
type probeResult struct {
	// Result is allowed, denied or error.
	Result string `json:"result"`
	Errno  string `json:"errno,omitempty"`
	Detail string `json:"detail,omitempty"`
}

func init() {
	// Through watcher exec's launcher, the probe runs on the launcher's
	// restricted thread in place of the exec.
	launch.SetInProcess(probeMain)
	// A runtime-placed probe acts from here, in any binary that links
	// this package (the agent's, a test's): no main needs to call in.
	// Packages this one does not import may not be initialised yet; the
	// probe exits before they ever run.
	probeInit()
}

// probeInit performs the probe and exits in a probe process; anywhere
// else (and in a launcher child, whose launch.Init runs the probe) it
// returns at once.
func probeInit() {
	if os.Getenv(envProbe) == "" || launch.IsChild() {
		return
	}
	runtime.LockOSThread()
	if os.Getenv(envWait) != "" {
		b := [1]byte{1}
		unix.Write(readyFD, b[:])
		unix.Close(readyFD)
		if n, _ := unix.Read(waitFD, b[:]); n != 1 {
			os.Exit(2) // the runner gave up before placing the probe
		}
		unix.Close(waitFD)
	}
	os.Exit(probeMain())
}

func encodeSpec(s probeSpec) string {
	b, _ := json.Marshal(s)
	return base64.StdEncoding.EncodeToString(b)
}

// probeMain performs the operation of the spec in the environment on the
// calling (locked) thread and prints the result.
func probeMain() int {
	var spec probeSpec
	b, err := base64.StdEncoding.DecodeString(os.Getenv(envProbe))
	if err == nil {
		err = json.Unmarshal(b, &spec)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "watcher canary probe: bad spec:", err)
		return 2
	}
	if spec.Op == opSleep {
		// A ptrace target outside the sandbox: lives until stdin closes.
		var b [1]byte
		unix.Read(0, b[:])
		return 0
	}
	res := perform(spec)
	out, _ := json.Marshal(res)
	unix.Write(1, append(out, '\n'))
	return 0
}

// perform runs the operation with raw system calls: Go's own wrappers may
// hand work to other threads, which carry none of the launcher's
// restrictions.
func perform(s probeSpec) probeResult {
	switch s.Op {
	case opRead:
		fd, err := unix.Open(s.Target, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return refused(err)
		}
		var buf [64]byte
		n, err := unix.Read(fd, buf[:])
		unix.Close(fd)
		if err != nil {
			return refused(err)
		}
		return probeResult{Result: Allowed, Detail: fmt.Sprintf("read %d bytes", n)}
	case opWrite:
		fd, err := unix.Open(s.Target, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return refused(err)
		}
		_, err = unix.Write(fd, []byte("watcher canary\n"))
		unix.Close(fd)
		if err != nil {
			return refused(err)
		}
		return probeResult{Result: Allowed, Detail: "wrote 15 bytes"}
	case opMount:
		if err := unix.Mount("watcher-canary", s.Target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k"); err != nil {
			return refused(err)
		}
		// It worked: take it away at once.
		unix.Unmount(s.Target, unix.MNT_DETACH)
		return probeResult{Result: Allowed, Detail: "mounted tmpfs (unmounted again)"}
	case opPtrace:
		// PTRACE_SEIZE does not stop the target; exiting detaches.
		if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(s.PID), 0, 0, 0, 0); e != 0 {
			return refused(e)
		}
		return probeResult{Result: Allowed, Detail: fmt.Sprintf("seized pid %d", s.PID)}
	case opBPF:
		// A one-entry array map: harmless, closed at once if it worked.
		attr := [5]uint32{unix.BPF_MAP_TYPE_ARRAY, 4, 4, 1, 0}
		fd, _, e := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&attr[0])), unsafe.Sizeof(attr))
		if e != 0 {
			return refused(e)
		}
		unix.Close(int(fd))
		return probeResult{Result: Allowed, Detail: "created an array map"}
	case opConnect:
		return connect(s.Target)
	case opFronted:
		return fronted(s.Target)
	case opDNS:
		return query(s.Target)
	}
	return probeResult{Result: "error", Detail: "unknown operation " + s.Op}
}

// refused classifies a failed operation: EPERM and EACCES are a layer's
// refusal; any other errno (a missing file, a refused connection) is an
// error, never taken for enforcement.
func refused(err error) probeResult {
	var en syscall.Errno
	if !errors.As(err, &en) {
		return probeResult{Result: "error", Detail: err.Error()}
	}
	if en == unix.EPERM || en == unix.EACCES {
		return probeResult{Result: Denied, Errno: unix.ErrnoName(en), Detail: en.Error()}
	}
	return probeResult{Result: "error", Errno: unix.ErrnoName(en), Detail: en.Error()}
}

// refusedAt is refused with the failed call named in the detail.
func refusedAt(call string, err error) probeResult {
	res := refused(err)
	res.Detail = call + ": " + res.Detail
	return res
}

func sockaddr(target string) (unix.Sockaddr, error) {
	ap, err := netip.ParseAddrPort(target)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("bad IPv4 address %q", target)
	}
	return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}, nil
}

// probeTimeout bounds a network probe's wait for the other side.
const probeTimeout = 3 * time.Second

// Socket calls with a timeout (SO_RCVTIMEO, SO_SNDTIMEO) are never
// restarted after a signal handler ran, whatever SA_RESTART says
// (signal(7)): they fail with EINTR, and the Go runtime does signal its
// threads. EINTR is no outcome of the probe, so the calls are made again
// until the probe's deadline; it was seen on the DNS probe's read about
// once in 10^4 queries, an "error (EINTR)" failure of a healthy layer.

// connectRetry connects fd to sa, going on after EINTR: the kernel then
// carries on with a stream connect in the background (EALREADY while in
// progress, EISCONN once done).
func connectRetry(fd int, sa unix.Sockaddr, deadline time.Time) error {
	for {
		err := unix.Connect(fd, sa)
		switch {
		case err == nil || errors.Is(err, unix.EISCONN):
			return nil
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EALREADY):
			time.Sleep(5 * time.Millisecond)
		default:
			return err
		}
		if time.Now().After(deadline) {
			return unix.ETIMEDOUT
		}
	}
}

// readRetry reads from fd, going on after EINTR until the deadline, with
// the socket's receive timeout set to what is left of it.
func readRetry(fd int, buf []byte, deadline time.Time) (int, error) {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return 0, unix.EAGAIN
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		n, err := unix.Read(fd, buf)
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// writeRetry writes b to fd, going on after EINTR until the deadline.
func writeRetry(fd int, b []byte, deadline time.Time) (int, error) {
	for {
		n, err := unix.Write(fd, b)
		if !errors.Is(err, unix.EINTR) || time.Now().After(deadline) {
			return n, err
		}
	}
}

func connect(target string) probeResult {
	sa, err := sockaddr(target)
	if err != nil {
		return probeResult{Result: "error", Detail: err.Error()}
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return refused(err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(probeTimeout.Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	if err := connectRetry(fd, sa, time.Now().Add(probeTimeout)); err != nil {
		return refused(err)
	}
	return probeResult{Result: Allowed, Detail: "connected to " + target}
}

// query sends one A query for name to ResolverAddr (with EDNS, so a
// refusal carries its RFC 8914 reason) and reads the answer.
func query(name string) probeResult {
	sa, _ := sockaddr(ResolverAddr.String())
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	m.SetEdns0(1232, false)
	wire, err := m.Pack()
	if err != nil {
		return probeResult{Result: "error", Detail: err.Error()}
	}
	// Each failure names its call: the egress hook refuses at connect,
	// anything on the packet's way (a firewall) at write.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return refusedAt("socket", err)
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(probeTimeout)
	if err := connectRetry(fd, sa, deadline); err != nil {
		return refusedAt("connect", err)
	}
	if _, err := writeRetry(fd, wire, deadline); err != nil {
		return refusedAt("write", err)
	}
	buf := make([]byte, 1500)
	n, err := readRetry(fd, buf, deadline)
	if err != nil {
		if errors.Is(err, unix.EAGAIN) {
			return probeResult{Result: "error", Detail: "no answer within " + probeTimeout.String()}
		}
		return refusedAt("read", err)
	}
	var resp dns.Msg
	if err := resp.Unpack(buf[:n]); err != nil {
		return probeResult{Result: "error", Detail: "bad answer: " + err.Error()}
	}
	detail := dns.RcodeToString[resp.Rcode]
	if opt := resp.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if ede, ok := o.(*dns.EDNS0_EDE); ok {
				detail += fmt.Sprintf(", EDE %d %s", ede.InfoCode, strings.TrimSpace(ede.ExtraText))
				switch ede.InfoCode {
				case dns.ExtendedErrorCodeBlocked, dns.ExtendedErrorCodeFiltered, dns.ExtendedErrorCodeProhibited, dns.ExtendedErrorCodeCensored:
					return probeResult{Result: Denied, Detail: detail}
				}
			}
		}
	}
	return probeResult{Result: Allowed, Detail: detail}
}

// fronted connects to target and sends a TLS ClientHello for FrontedName:
// the relay's fatal alert is the refusal; a server's hello means the name
// went through.
func fronted(target string) probeResult {
	hello, err := clientHello(FrontedName)
	if err != nil {
		return probeResult{Result: "error", Detail: "build a ClientHello: " + err.Error()}
	}
	c, err := net.DialTimeout("tcp4", target, probeTimeout)
	if err != nil {
		var en syscall.Errno
		if errors.As(err, &en) {
			return refusedAt("connect", en)
		}
		return probeResult{Result: "error", Detail: err.Error()}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(probeTimeout))
	if _, err := c.Write(hello); err != nil {
		return probeResult{Result: "error", Detail: "send the ClientHello: " + err.Error()}
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return probeResult{Result: "error", Detail: "no answer to the ClientHello: " + err.Error()}
	}
	switch b[0] {
	case 0x15:
		return probeResult{Result: Denied, Detail: "TLS alert for server name " + FrontedName}
	case 0x16:
		return probeResult{Result: Allowed, Detail: "a server answered server name " + FrontedName}
	}
	return probeResult{Result: "error", Detail: fmt.Sprintf("TLS record type %d in answer", b[0])}
}

// clientHello is the first TLS record crypto/tls sends for name.
func clientHello(name string) ([]byte, error) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Client(a, &tls.Config{ServerName: name, InsecureSkipVerify: true}).Handshake()
	b.SetReadDeadline(time.Now().Add(probeTimeout))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		return nil, err
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		return nil, err
	}
	return append(hdr, body...), nil
}
