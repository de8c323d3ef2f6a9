package adversarial

// Class 10, egress entry points (issue 29): every TCP connection from a
// sandbox is tied to a name the policy allowed. The connect hooks
// (bpf/egress.c) admit only answered addresses and send TCP to them through
// the name relay (bpf/include/relay.h relay_tcp, internal/namerelay), which
// judges the TLS SNI or HTTP Host. A root attacker that has read the source
// tries the other ways into a connection: TCP Fast Open (data in the SYN),
// io_uring, MPTCP and SCTP sockets, IPv4-mapped addresses on a dual-stack
// socket, the wildcard and the host's own addresses, a second connect after
// an AF_UNSPEC disconnect, per-message addresses on a connected UDP socket
// and sendmmsg, sockets made outside the sandbox (inherited, or passed by
// SCM_RIGHTS), and raw and packet sockets. Its goal: a fronted name
// (evil.test, on the CDN that serves the allowed a.cdn.test) or an address
// nothing answered (dark). The servers (egress_fixture_test.go) say from
// outside whether it got there; each attack has a benign neighbour on the
// same entry point that still works.
//
//	go test -count=1 -run TestEgressAdversarial ./test/adversarial/

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
)

// curEgress is the world of the running egress test (the rows' setup and
// judges read it).
var curEgress *egressWorld

func egressArg(b *bed) string { curEgress.seen.reset(); return curEgress.arg() }

// seenBy: the attack reached what marker names (a server logged it).
func seenBy(marker string) func(*bed, outcome) (bool, string) {
	return func(_ *bed, _ outcome) (bool, string) {
		if ok, line := curEgress.seen.has(marker); ok {
			return true, "server saw: " + line
		}
		return false, "no server saw " + marker
	}
}

// servedBy: a benign row got its answer and the server logged it.
func servedBy(marker string) func(*bed, outcome) (bool, string) {
	return func(b *bed, o outcome) (bool, string) {
		ok, why := seenBy(marker)(b, o)
		if ok && o.result == "achieved" {
			return true, why
		}
		return false, fmt.Sprintf("%s; attacker %s", why, o.result)
	}
}

const (
	seenFronted80  = "cdn80 host=" + frontedName
	seenFronted443 = "cdn443 hello sni=" + frontedName
	seenAllowed80  = "cdn80 host=" + cdnName
	seenDarkTCP    = "dark tcp"
	seenDarkUDP    = "dark udp"
	seenHostLocal  = "host-local"
	seenCDNUDP     = "cdn udp"
	seenRuled      = "ruled tcp"
)

var egressTechniques = []technique{
	{class: 10, name: "egress-tls-fronted", variant: "TLS to the CDN, SNI evil.test (the classic front)", achieved: seenBy(seenFronted443)},
	{class: 10, name: "egress-tls-inner-host", variant: "TLS with SNI a.cdn.test, Host evil.test inside (the front routes by Host)", achieved: seenBy("cdn443 host=" + frontedName)},
	{class: 10, name: "egress-benign-tls", variant: "TLS to the CDN, SNI a.cdn.test", benign: true, achieved: servedBy("cdn443 host=" + cdnName)},
	{class: 10, name: "egress-http-absolute-form", variant: "GET http://evil.test/ with Host a.cdn.test (servers route by the absolute URI)", achieved: seenBy(seenFronted80)},
	{class: 10, name: "egress-http-no-host", variant: "HTTP/1.0 request without Host (the CDN's default site)", achieved: seenBy("cdn80 host= ")},
	{class: 10, name: "egress-tfo-sendto-fronted", variant: "sendto MSG_FASTOPEN to the CDN:80, Host evil.test in the SYN's data", achieved: seenBy(seenFronted80)},
	{class: 10, name: "egress-tfo-sendto-dark", variant: "sendto MSG_FASTOPEN to an unanswered address", achieved: seenBy(seenDarkTCP)},
	{class: 10, name: "egress-benign-tfo-sendto", variant: "sendto MSG_FASTOPEN to the CDN:80, Host a.cdn.test", benign: true, achieved: servedBy(seenAllowed80)},
	{class: 10, name: "egress-tfo-connect-fronted", variant: "TCP_FASTOPEN_CONNECT + connect to the CDN:80, write Host evil.test", achieved: seenBy(seenFronted80)},
	{class: 10, name: "egress-tfo-connect-dark", variant: "TCP_FASTOPEN_CONNECT + connect to an unanswered address", achieved: seenBy(seenDarkTCP)},
	{class: 10, name: "egress-benign-tfo-connect", variant: "TCP_FASTOPEN_CONNECT + connect to the CDN:80, Host a.cdn.test", benign: true, achieved: servedBy(seenAllowed80)},
	{class: 10, name: "egress-iouring-connect", variant: "io_uring_setup (for IORING_OP_CONNECT/SENDMSG to an unanswered address)", achieved: printed("RING-MADE")},
	{class: 10, name: "egress-mptcp-fronted", variant: "socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP) to the CDN:80, Host evil.test", achieved: seenBy(seenFronted80)},
	{class: 10, name: "egress-mptcp-dark", variant: "MPTCP connect to an unanswered address", achieved: seenBy(seenDarkTCP)},
	{class: 10, name: "egress-benign-mptcp", variant: "MPTCP connect to the CDN:80, Host a.cdn.test", benign: true, achieved: servedBy(seenAllowed80)},
	{class: 10, name: "egress-sctp-dark", variant: "socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) to an unanswered address", achieved: printed("SCTP-REACHED")},
	{class: 10, name: "egress-v4mapped-fronted", variant: "AF_INET6 dual-stack socket to [::ffff:CDN]:80, Host evil.test", achieved: seenBy(seenFronted80)},
	{class: 10, name: "egress-v4mapped-dark", variant: "AF_INET6 dual-stack socket to [::ffff:DARK]:80", achieved: seenBy(seenDarkTCP)},
	{class: 10, name: "egress-benign-v4mapped", variant: "AF_INET6 dual-stack socket to [::ffff:CDN]:80, Host a.cdn.test", benign: true, achieved: servedBy(seenAllowed80)},
	{class: 10, name: "egress-v6-fronted", variant: "AF_INET6 to the CDN's IPv6 (answered, AAAA):80, Host evil.test", achieved: seenBy(seenFronted80)},
	{class: 10, name: "egress-v6-dark", variant: "AF_INET6 to an unanswered IPv6 address", achieved: seenBy(seenDarkTCP)},
	{class: 10, name: "egress-benign-v6", variant: "AF_INET6 to the CDN's IPv6:80, Host a.cdn.test", benign: true, achieved: servedBy(seenAllowed80)},
	{class: 10, name: "egress-connect-any4", variant: "connect 0.0.0.0:PORT (the kernel sends it to loopback's host service)", achieved: seenBy(seenHostLocal)},
	{class: 10, name: "egress-connect-any6", variant: "connect [::]:PORT (loopback's host service)", achieved: seenBy(seenHostLocal)},
	{class: 10, name: "egress-connect-hostaddr", variant: "connect the host's own address:PORT", achieved: seenBy(seenHostLocal)},
	{class: 10, name: "egress-loopback-listeners", variant: "connect every TCP listener on 127.0.0.1 (/proc/net/tcp: the relay, the proxy, host services) with Host evil.test", setup: func(b *bed) string {
		return egressArg(b) + " " + strconv.Itoa(b.DNSPort)
	}, achieved: printed("LOOPBACK-CONNECTED")},
	{class: 10, name: "egress-reconnect-unspec-dark", variant: "connect the CDN:80, AF_UNSPEC disconnect, connect an unanswered address", achieved: seenBy(seenDarkTCP)},
	{class: 10, name: "egress-benign-reconnect-unspec", variant: "connect the CDN:80, AF_UNSPEC disconnect, connect it again, Host a.cdn.test", benign: true, achieved: servedBy(seenAllowed80)},
	{class: 10, name: "egress-udp-msgname-dark", variant: "UDP connected to :53, sendmsg with an unanswered msg_name", achieved: seenBy(seenDarkUDP)},
	{class: 10, name: "egress-sendmmsg-dark", variant: "sendmmsg: a DNS query to :53, then a datagram to an unanswered address", achieved: seenBy(seenDarkUDP)},
	{class: 10, name: "egress-benign-udp-dns", variant: "UDP DNS query for a.cdn.test, then HTTP to the CDN, Host a.cdn.test", benign: true, achieved: servedBy(seenAllowed80)},
	{class: 10, name: "egress-udp-altport-cdn", variant: "UDP to the CDN (answered) on port 8443: a datagram off 443 would carry an unjudged name", achieved: seenBy(seenCDNUDP)},
	{class: 10, name: "egress-quic-cdn", variant: "UDP 443 to the CDN (QUIC: its SNI is not judged)", achieved: seenBy("cdn quic")},
	{class: 10, name: "egress-ping-socket", variant: "socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP): echo requests carry data to any address", achieved: printed("SOCKET-MADE")},
	{class: 10, name: "egress-netns-fronted", variant: "a process of the sandbox in another network namespace (a container's): the CDN:80, Host evil.test, after a sibling resolved a.cdn.test", setup: resolveBySibling, achieved: seenBy(seenFronted80)},
	{class: 10, name: "egress-benign-netns-rule", variant: "the same, to an address an egress.allow rule names", setup: egressArg, benign: true, achieved: servedBy(seenRuled)},
	{class: 10, name: "egress-inherited-socket-dark", variant: "TCP socket made outside, inherited across the cgroup move, to an unanswered address", setup: egressArg, achieved: seenBy(seenDarkTCP)},
	{class: 10, name: "egress-scm-rights-fronted", variant: "TCP socket made outside, passed by SCM_RIGHTS, to the CDN:80, Host evil.test", setup: scmRightsSetup, achieved: seenBy(seenFronted80)},
	{class: 10, name: "egress-raw-udp-dark", variant: "socket(AF_INET, SOCK_RAW, IPPROTO_UDP): a hand-made datagram to an unanswered address", achieved: seenBy(seenDarkUDP)},
	{class: 10, name: "egress-raw6-socket", variant: "socket(AF_INET6, SOCK_RAW, IPPROTO_TCP)", achieved: printed("SOCKET-MADE")},
	{class: 10, name: "egress-packet-dgram", variant: "socket(AF_PACKET, SOCK_DGRAM, ETH_P_IP)", achieved: printed("SOCKET-MADE")},
}

// knownOpen rows of this class (see the map in suite_test.go); keyed for
// every layer, the hole is in none of them.
func init() {
	for _, layer := range []string{"lsm", "fmod_ret", "backstop"} {
		for _, path := range []string{"sandbox", "exec"} {
			knownOpen["egress-tls-inner-host/"+path+"/"+layer] = "the Host inside TLS is not visible to the relay; only the SNI is judged unless names.inspect lists the name (egress-names.md, Limits)"
		}
	}
	for i := range egressTechniques {
		if egressTechniques[i].setup == nil {
			egressTechniques[i].setup = egressArg
		}
	}
}

// sandboxOnly rows need what only a runtime hands a process before it
// joins the sandbox (a socket made outside, a network namespace of its
// own): watcher exec hands neither.
var sandboxOnly = map[string]bool{"egress-inherited-socket-dark": true, "egress-netns-fronted": true, "egress-benign-netns-rule": true}

// TestEgressAdversarial runs class 10 in the sandbox as a container
// runtime places a process (root, every capability, no seccomp) and
// through watcher exec.
func TestEgressAdversarial(t *testing.T) {
	b, w := newEgressBed(t)
	curEgress = w
	defer func() { curEgress = nil }()
	var rows []row
	for _, tech := range egressTechniques {
		for _, path := range []string{"sandbox", "exec"} {
			if path == "exec" && sandboxOnly[tech.name] {
				continue
			}
			t.Run(tech.name+"/"+path, func(t *testing.T) {
				r := row{tech: tech, path: path}
				defer func() {
					r.failed = t.Failed()
					rows = append(rows, r)
				}()
				b.t = t
				arg := tech.setup(b)
				var o outcome
				switch {
				case path == "exec":
					o = b.viaExec(tech.name, arg)
				case tech.name == "egress-inherited-socket-dark":
					o = b.inSandboxVia(tech.name, arg, true, "")
				case tech.name == "egress-netns-fronted" || tech.name == "egress-benign-netns-rule":
					o = b.inSandboxVia(tech.name, arg, false, w.ns)
				default:
					o = b.inSandbox(tech.name, arg)
				}
				r = judge(t, b, tech, o)
				if tech.benign {
					// nothing refused to show
				} else if evs := b.eventsFor(o, nil); len(evs) > 0 {
					r.event = eventSummary(evs[0])
					if n := evs[0].Net; n != nil {
						r.event += ": " + n.Reason
					}
				}
				t.Logf("%s: %s; attacker said:\n%s", tech.name, r.verdict, o.out)
				b.ensureAgent()
			})
		}
	}
	b.t = t
	printTable(t, b, rows)
}

// inSandboxVia is inSandbox with what a runtime may hand a process before
// it joins the sandbox: a TCP socket this (outside) process made, as the
// attacker's fd 3 (socket), or a network namespace of its own (netns: the
// world's, where the CDN is a local address).
func (b *bed) inSandboxVia(tech, arg string, socket bool, netns string) outcome {
	t := b.t
	var files []*os.File
	if socket {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "outside-socket")
		defer f.Close()
		files = append(files, f)
	}
	b.leafSeq++
	leaf := filepath.Join(b.cgAbs, fmt.Sprintf("c%d", b.leafSeq))
	if err := cgroupfs.Create(leaf); err != nil {
		t.Fatal(err)
	}
	o := outcome{path: "sandbox", started: time.Now()}
	o.cgroup, _ = cgroupfs.ID(leaf)
	cmd := exec.Command(b.self, "-test.run=^$")
	if netns != "" {
		// nsenter, not ip netns exec: that mounts the namespace's own
		// /sys, where the leaf's cgroup.procs is not.
		cmd = exec.Command("nsenter", "--net=/run/netns/"+netns, b.self, "-test.run=^$")
	}
	cmd.Env = append(b.attackEnv(tech, arg), "ADV_JOIN="+filepath.Join(leaf, "cgroup.procs"))
	cmd.Dir = b.ws
	cmd.ExtraFiles = files
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(60*time.Second, func() { cgroupfs.Kill(leaf) })
	cmd.Wait()
	timer.Stop()
	o.out = out.String()
	var sig syscall.Signal
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		sig = ws.Signal()
	}
	o.result = resultOf(cmd.ProcessState.ExitCode(), sig)
	o.parsePIDs()
	if len(o.pids) == 0 {
		o.pids = []int{cmd.Process.Pid}
	}
	cgroupfs.Kill(leaf)
	return o
}

// resolveBySibling has another process of the sandbox, in the agent's
// network namespace, resolve a.cdn.test: admissions are the sandbox's.
func resolveBySibling(b *bed) string {
	arg := egressArg(b)
	if o := b.inSandbox("egress-resolve", arg); o.result != "achieved" {
		b.t.Fatalf("sibling's resolve: %s\n%s", o.result, o.out)
	}
	return arg
}

// scmRightsSetup serves, on a unix socket in the workspace (a path the
// sandbox may connect to), one TCP socket made by this process outside
// the sandbox to each client. ADV_ARG gets the socket's path.
func scmRightsSetup(b *bed) string {
	path := filepath.Join(b.ws, "fd.sock")
	os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		b.t.Fatal(err)
	}
	os.Chmod(path, 0o777)
	b.t.Cleanup(func() { ln.Close(); os.Remove(path) })
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0); err == nil {
				c.WriteMsgUnix([]byte("FD"), unix.UnixRights(fd), nil)
				unix.Close(fd)
			}
			c.Close()
		}
	}()
	return egressArg(b) + " " + path
}
