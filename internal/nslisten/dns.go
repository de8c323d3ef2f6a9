package nslisten

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/watcherhq/watcher/internal/dnsproxy"
)

// DNSHandler answers one raw query (dnsproxy.Server.HandlePacket): the
// proxy's handler chain, with the sandbox told from the source.
type DNSHandler func(ctx context.Context, raw []byte, src dnsproxy.QuerySource) []byte

// dnsSock is one UDP socket and one TCP listener on the same address.
type dnsSock struct {
	addr netip.Addr
	udp  *net.UDPConn
	tcp  *net.TCPListener
}

func (s dnsSock) port() uint16 { return uint16(s.udp.LocalAddr().(*net.UDPAddr).Port) }

func (s dnsSock) close() {
	s.udp.Close()
	s.tcp.Close()
}

// bindDNS binds UDP and TCP on addr, on a free port that taken does not
// reject (called on a thread inside the namespace).
func bindDNS(addr netip.Addr, taken func(uint16) bool) (dnsSock, error) {
	var last error
	for range 20 {
		pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
		if err != nil {
			return dnsSock{}, fmt.Errorf("dns listener %s: %w", addr, err)
		}
		s := dnsSock{addr: addr, udp: pc}
		if taken(s.port()) {
			pc.Close()
			last = fmt.Errorf("dns listener %s: port %d taken elsewhere", addr, s.port())
			continue
		}
		ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr, s.port())))
		if err != nil {
			pc.Close()
			last = fmt.Errorf("dns listener %s tcp: %w", addr, err)
			if errors.Is(err, syscall.EADDRINUSE) {
				continue
			}
			return dnsSock{}, last
		}
		s.tcp = ln
		return s, nil
	}
	return dnsSock{}, last
}

// Bounds of one namespace's DNS serving.
const (
	maxInflight    = 64
	maxTCPConns    = 32
	tcpIdleTimeout = 10 * time.Second
	queryTimeout   = 5 * time.Second
)

type dnsServer struct {
	socks []dnsSock
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func serveDNS(h DNSHandler, socks []dnsSock) *dnsServer {
	s := &dnsServer{socks: socks, conns: map[net.Conn]struct{}{}}
	for _, k := range socks {
		s.wg.Add(2)
		go s.serveUDP(h, k.udp)
		go s.serveTCP(h, k.tcp)
	}
	return s
}

func (s *dnsServer) close() {
	for _, k := range s.socks {
		k.close()
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *dnsServer) serveUDP(h DNSHandler, conn *net.UDPConn) {
	defer s.wg.Done()
	local := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	slots := make(chan struct{}, maxInflight)
	for {
		buf := make([]byte, 4096)
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			continue // over the bound: dropped, the client retries
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-slots }()
			ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
			defer cancel()
			src := dnsproxy.QuerySource{Proto: "udp", Local: local, Remote: from}
			if resp := h(ctx, buf[:n], src); resp != nil {
				conn.WriteToUDPAddrPort(resp, from)
			}
		}()
	}
}

func (s *dnsServer) serveTCP(h DNSHandler, ln *net.TCPListener) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.mu.Lock()
		if len(s.conns) >= maxTCPConns {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveTCPConn(h, c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		}()
	}
}

func (s *dnsServer) serveTCPConn(h DNSHandler, c net.Conn) {
	src := dnsproxy.QuerySource{Proto: "tcp", Local: c.LocalAddr().(*net.TCPAddr).AddrPort(), Remote: c.RemoteAddr().(*net.TCPAddr).AddrPort()}
	buf := make([]byte, 65535)
	for {
		c.SetDeadline(time.Now().Add(tcpIdleTimeout))
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, buf[:n]); err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
		resp := h(ctx, buf[:n], src)
		cancel()
		if resp == nil {
			if n < 12 {
				return
			}
			continue
		}
		frame := make([]byte, 2, 2+len(resp))
		binary.BigEndian.PutUint16(frame, uint16(len(resp)))
		if _, err := c.Write(append(frame, resp...)); err != nil {
			return
		}
	}
}
