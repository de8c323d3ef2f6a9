package adversarial

// Class 8, inbound: a sandboxed root listens where other hosts can connect
// and serves the workspace (issue 25, section 3). Binds to non-loopback
// addresses are refused (EPERM, cgroup/bind4 and bind6) unless the port is
// listed; the adv sandbox's preset lists none. A bind that joins a host
// service's SO_REUSEPORT group is refused too. The sandbox's own loopback
// server and client keep working (egress lets a sandbox reach a loopback
// socket of its own, bpf/include/listen.h), while a host service on
// loopback stays refused by egress. listen(2) on an unbound socket is not
// refused (no hook runs): its connections from other hosts are dropped,
// which needs a peer in another network namespace and is tested in
// internal/enforce/cgroupbpf (TestListen).

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

func init() {
	techniques = append(techniques,
		technique{class: 8, name: "listen-wildcard-tcp", variant: "bind 0.0.0.0:PORT and listen", setup: freePort, achieved: printed("LISTENING")},
		technique{class: 8, name: "listen-dualstack-tcp", variant: "bind [::]:PORT (accepts IPv4 too) and listen", setup: freePort, achieved: printed("LISTENING")},
		technique{class: 8, name: "listen-v4mapped-tcp", variant: "bind [::ffff:0.0.0.0]:PORT and listen", setup: freePort, achieved: printed("LISTENING")},
		technique{class: 8, name: "listen-wildcard-udp", variant: "bind UDP 0.0.0.0:PORT", setup: freePort, achieved: printed("LISTENING")},
		technique{class: 8, name: "listen-reuseport-takeover", variant: "SO_REUSEPORT bind onto a host service's 127.0.0.1 port", setup: hostReuseportService, achieved: printed("LISTENING")},
		technique{class: 8, name: "loopback-host-service", variant: "connect to a host service on 127.0.0.1 (the own-server exception must not open it)", setup: hostReuseportService, achieved: printed("CONNECTED")},
		technique{class: 8, name: "benign-loopback-server", variant: "server on 127.0.0.1 and its own client", benign: true, achieved: benignOK("LOOPBACK-SERVED")},
	)
	attacks["listen-wildcard-tcp"] = func(_ attackEnv, _ string) error { return bindListen("0.0.0.0", unix.SOCK_STREAM, false) }
	attacks["listen-dualstack-tcp"] = func(_ attackEnv, _ string) error { return bindListen("::", unix.SOCK_STREAM, false) }
	attacks["listen-v4mapped-tcp"] = func(_ attackEnv, _ string) error { return bindListen("::ffff:0.0.0.0", unix.SOCK_STREAM, false) }
	attacks["listen-wildcard-udp"] = func(_ attackEnv, _ string) error { return bindListen("0.0.0.0", unix.SOCK_DGRAM, false) }
	attacks["listen-reuseport-takeover"] = func(_ attackEnv, _ string) error { return bindListen("127.0.0.1", unix.SOCK_STREAM, true) }
	attacks["benign-loopback-server"] = loopbackServer
	attacks["loopback-host-service"] = func(_ attackEnv, _ string) error {
		c, err := net.Dial("tcp", "127.0.0.1:"+os.Getenv("ADV_ARG"))
		if err != nil {
			return unwrapErrno(err)
		}
		c.Close()
		fmt.Println("CONNECTED")
		return nil
	}
}

// freePort picks a port nothing listens on now (the attacker's ADV_ARG).
func freePort(b *bed) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// hostReuseportService stands for a host service on loopback that set
// SO_REUSEPORT (as many servers do for their workers); its port is ADV_ARG.
func hostReuseportService(b *bed) string {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
		if err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { ln.Close() })
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// bindListen binds addr:ADV_ARG (listening for TCP) and prints LISTENING.
func bindListen(addr string, typ int, reuseport bool) error {
	port, err := strconv.Atoi(os.Getenv("ADV_ARG"))
	if err != nil {
		return fmt.Errorf("ADV_ARG: %w", err)
	}
	ip := net.ParseIP(addr)
	family, sa := unix.AF_INET6, unix.Sockaddr(nil)
	if ip4 := ip.To4(); ip4 != nil && addr != "::ffff:0.0.0.0" {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: port, Addr: [4]byte(ip4)}
	} else {
		sa = &unix.SockaddrInet6{Port: port, Addr: [16]byte(ip.To16())}
	}
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if reuseport {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			return err
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return err
	}
	if typ == unix.SOCK_STREAM {
		if err := unix.Listen(fd, 8); err != nil {
			return err
		}
	}
	fmt.Println("LISTENING")
	return nil
}

// loopbackServer serves one connection on 127.0.0.1 to its own client.
func loopbackServer(_ attackEnv, _ string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return unwrapErrno(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Write([]byte("LOOPBACK-SERVED\n"))
			c.Close()
		}
	}()
	fmt.Println("LISTENING on", ln.Addr())
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		fmt.Println("connect:", err)
		return unwrapErrno(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		return unwrapErrno(err)
	}
	fmt.Print(string(buf[:n]))
	return nil
}
