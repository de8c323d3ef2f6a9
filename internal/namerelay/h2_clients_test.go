package namerelay

import (
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// curl, built with nghttp2, negotiates h2 with the relay: the secret is
// swapped, a read-only POST refused, and a request for another name on
// the connection (curl turns a Host header into :authority) answered 421
// while the request after it on the same connection passes.
func TestH2Curl(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	if out, _ := exec.Command("curl", "--version").Output(); !strings.Contains(string(out), "HTTP2") {
		t.Skip("curl is built without HTTP/2 (nghttp2)")
	}
	f := newBrokerFixture(t, true)
	port := f.addr.Port()
	curl := func(args ...string) string {
		t.Helper()
		base := []string{"-sS", "--max-time", "10", "--http2", "--cacert", f.caFile}
		for _, n := range []string{"api.test", "ro.test"} {
			base = append(base, "--resolve", n+":"+itoa(port)+":127.0.0.1")
		}
		out, err := exec.Command("curl", append(base, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("curl %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	url := "https://api.test:" + itoa(port) + "/v1/models"
	got := curl("-H", "Authorization: Bearer "+tokenPlaceholder, "-w", " [%{http_version} %{http_code}]", url)
	if want := "HTTP/2.0 GET host=api.test:" + itoa(port) + " auth=Bearer " + tokenValue + " [2 200]"; got != want {
		t.Errorf("curl --http2 to the bound host:\n got %q\nwant %q", got, want)
	}
	got = curl("-X", "POST", "-d", "x", "-w", " [%{http_version} %{http_code}]", "https://ro.test:"+itoa(port)+"/")
	if !strings.Contains(got, `"POST" refused`) || !strings.HasSuffix(got, "[2 403]") {
		t.Errorf("curl --http2 POST to a read-only name: %q", got)
	}
	// Two transfers, one connection (num_connects 0 on the second): the
	// coalesced one refused, then api.test's own.
	got = curl("-H", "Host: other.test", "-w", " [%{http_code} %{num_connects}]\n", url,
		"--next", "--http2", "--cacert", f.caFile, "--resolve", "api.test:"+itoa(port)+":127.0.0.1",
		"-w", " [%{http_code} %{num_connects}]", url)
	lines := strings.Split(got, "\n")
	if len(lines) != 3 || !strings.HasSuffix(lines[1], "[421 1]") || !strings.Contains(lines[0], "needs a connection of its own") ||
		lines[2] != "HTTP/2.0 GET host=api.test:"+itoa(port)+" auth= [200 0]" {
		t.Errorf("coalesced then own request on one curl connection:\n%s", got)
	}
	if _, ok := f.event(`HTTP/2 request for "other.test" on the connection for TLS server name "api.test"`); !ok {
		t.Error("the coalesced request was not recorded")
	}
	f.noSecretInEvents(t)
}

// Node: node:http2 negotiates h2 and gets the secret swapped; fetch
// (undici) offers only http/1.1 unless told allowH2, and passes over the
// unchanged HTTP/1.1 path.
func TestH2Node(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed")
	}
	f := newBrokerFixture(t, true)
	port := itoa(f.addr.Port())
	script := `const http2 = require("node:http2"), tls = require("node:tls"), fs = require("node:fs");
const ca = fs.readFileSync(process.env.CA);
const s = http2.connect("https://api.test:` + port + `", {ca, lookup: (h, o, cb) => cb(null, o.all ? [{address: "127.0.0.1", family: 4}] : "127.0.0.1", 4)});
const r = s.request({":path": "/", authorization: "Bearer ` + tokenPlaceholder + `"});
let b = "";
r.on("data", d => b += d).on("end", () => {
  console.log("h2=" + s.alpnProtocol + " " + b);
  s.close();
  const sock = tls.connect({host: "127.0.0.1", port: ` + port + `, servername: "api.test", ca, ALPNProtocols: ["http/1.1"]}, () => {
    sock.write("GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer ` + tokenPlaceholder + `\r\nConnection: close\r\n\r\n");
  });
  let h1 = ""; sock.on("data", d => h1 += d).on("end", () => console.log("h1=" + sock.alpnProtocol + " " + h1.split("\r\n\r\n")[1]));
});`
	cmd := exec.Command("node", "-e", script)
	cmd.Env = append(cmd.Environ(), "CA="+f.caFile)
	out, err := cmd.CombinedOutput()
	want := "h2=h2 HTTP/2.0 GET host=api.test:" + port + " auth=Bearer " + tokenValue + "\n" +
		"h1=http/1.1 HTTP/1.1 GET host=api.test auth=Bearer " + tokenValue + "\n"
	if err != nil || string(out) != want {
		t.Errorf("node: %v:\n got %q\nwant %q", err, out, want)
	}
}

// A malformed HTTP/2 frame sequence gets GOAWAY with PROTOCOL_ERROR and
// is recorded; a client that negotiated h2 and speaks HTTP/1.1 gets a
// GOAWAY whose debug data says why. A well-formed connection beside them
// passes.
func TestH2Malformed(t *testing.T) {
	f := newBrokerFixture(t, true)
	cases := []struct {
		name   string
		send   func(fr *http2.Framer, c *tls.Conn)
		reason string // in the event
		debug  string // in the GOAWAY's debug data
	}{
		{"CONTINUATION expected, DATA sent", func(fr *http2.Framer, _ *tls.Conn) {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: headerBlock(t, "api.test"), EndHeaders: false})
			fr.WriteData(1, true, []byte("x"))
		}, "malformed HTTP/2 from the client: connection error: PROTOCOL_ERROR", ""},
		{"HEADERS on an even stream", func(fr *http2.Framer, _ *tls.Conn) {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, BlockFragment: headerBlock(t, "api.test"), EndHeaders: true, EndStream: true})
		}, "malformed HTTP/2 from the client: conn_PROTOCOL_ERROR_headers_even", ""},
		{"HTTP/1.1 after h2", func(_ *http2.Framer, c *tls.Conn) {
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
		}, "it negotiated h2 but sent", "not the HTTP/2 connection preface"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tls.Dial("tcp", f.addr.String(), &tls.Config{ServerName: "api.test", RootCAs: f.roots, NextProtos: []string{"h2"}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fr := http2.NewFramer(c, c)
			if tc.debug == "" {
				io.WriteString(c, http2.ClientPreface)
				fr.WriteSettings()
			}
			tc.send(fr, c)
			var ga *http2.GoAwayFrame
			for ga == nil {
				fm, err := fr.ReadFrame()
				if err != nil {
					t.Fatalf("no GOAWAY before %v", err)
				}
				ga, _ = fm.(*http2.GoAwayFrame)
			}
			if ga.ErrCode != http2.ErrCodeProtocol || !strings.Contains(string(ga.DebugData()), tc.debug) {
				t.Errorf("GOAWAY %v %q", ga.ErrCode, ga.DebugData())
			}
			// The relay closes the connection after its GOAWAY.
			for {
				if _, err := fr.ReadFrame(); err != nil {
					if !errors.Is(err, io.EOF) {
						t.Errorf("after GOAWAY: %v, want EOF", err)
					}
					break
				}
			}
			if _, ok := f.event(tc.reason); !ok {
				t.Errorf("no event with %q", tc.reason)
			}
		})
	}
	if _, code, _ := do(t, f.client(true), "GET", "https://api.test/", "", ""); code != http.StatusOK {
		t.Errorf("a well-formed connection beside the malformed ones: %d", code)
	}
}

func headerBlock(t *testing.T, authority string) []byte {
	var b strings.Builder
	enc := hpack.NewEncoder(&b)
	for _, h := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", authority}, {":path", "/"}} {
		if err := enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]}); err != nil {
			t.Fatal(err)
		}
	}
	return []byte(b.String())
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }

// A stream without :path is malformed on its own: RST_STREAM with
// PROTOCOL_ERROR and an event, and the next stream on the connection is
// answered.
func TestH2MalformedStream(t *testing.T) {
	f := newBrokerFixture(t, true)
	c, err := tls.Dial("tcp", f.addr.String(), &tls.Config{ServerName: "api.test", RootCAs: f.roots, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.WriteSettings()
	var b strings.Builder
	enc := hpack.NewEncoder(&b)
	for _, h := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", "api.test"}} {
		enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte(b.String()), EndHeaders: true, EndStream: true})
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: headerBlock(t, "api.test"), EndHeaders: true, EndStream: true})
	var reset *http2.RSTStreamFrame
	status := ""
	for reset == nil || status == "" {
		fm, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reset %v, status of stream 3 %q: %v", reset, status, err)
		}
		switch fm := fm.(type) {
		case *http2.RSTStreamFrame:
			reset = fm
		case *http2.MetaHeadersFrame:
			if fm.StreamID == 3 {
				status = fm.PseudoValue("status")
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v: the connection ended for one stream's error", fm.ErrCode)
		}
	}
	if reset.StreamID != 1 || reset.ErrCode != http2.ErrCodeProtocol || status != "200" {
		t.Errorf("RST_STREAM %d %v, stream 3 status %q", reset.StreamID, reset.ErrCode, status)
	}
	if _, ok := f.event("malformed HTTP/2 from the client: stream_PROTOCOL_ERROR_bad_path_method"); !ok {
		t.Error("the malformed stream was not recorded")
	}
}

// A Host header beside :authority cannot carry another name past the
// judged one: the destination sees the :authority, or the stream is
// refused as malformed.
func TestH2HostBesideAuthority(t *testing.T) {
	f := newBrokerFixture(t, true)
	c, err := tls.Dial("tcp", f.addr.String(), &tls.Config{ServerName: "api.test", RootCAs: f.roots, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.WriteSettings()
	var b strings.Builder
	enc := hpack.NewEncoder(&b)
	for _, h := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", "api.test"}, {":path", "/"}, {"host", "other.test"}} {
		enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte(b.String()), EndHeaders: true, EndStream: true})
	var body []byte
	for {
		fm, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("before the stream ended: %v", err)
		}
		switch fm := fm.(type) {
		case *http2.RSTStreamFrame:
			if _, ok := f.event("malformed HTTP/2 from the client"); fm.ErrCode != http2.ErrCodeProtocol || !ok {
				t.Errorf("refused with RST_STREAM %v, recorded %v", fm.ErrCode, ok)
			}
			return
		case *http2.GoAwayFrame:
			t.Logf("refused: GOAWAY %v", fm.ErrCode)
			return
		case *http2.DataFrame:
			body = append(body, fm.Data()...)
			if !fm.StreamEnded() {
				continue
			}
			if !strings.Contains(string(body), "host=api.test ") {
				t.Errorf("the destination saw %q", body)
			}
			return
		}
	}
}

// curl fronting an inspected name: the Host of another site inside the
// TLS for inspect.test is refused over HTTP/1.1 (403) and HTTP/2 (421),
// while inspect.test's own request passes.
func TestInspectCurl(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	f := newBrokerFixture(t, true)
	port := itoa(f.addr.Port())
	url := "https://inspect.test:" + port + "/"
	for _, c := range []struct{ proto, fronted string }{{"--http1.1", "403"}, {"--http2", "421"}} {
		if c.proto == "--http2" {
			if out, _ := exec.Command("curl", "--version").Output(); !strings.Contains(string(out), "HTTP2") {
				t.Log("curl is built without HTTP/2 (nghttp2): HTTP/2 not checked")
				continue
			}
		}
		args := []string{"-sS", "--max-time", "10", c.proto, "--cacert", f.caFile, "--resolve", "inspect.test:" + port + ":127.0.0.1", "-w", " [%{http_code}]"}
		out, err := exec.Command("curl", append(args, url)...).CombinedOutput()
		if err != nil || !strings.HasSuffix(string(out), "[200]") || !strings.Contains(string(out), "host=inspect.test") {
			t.Errorf("curl %s to the inspected name: %v %q", c.proto, err, out)
		}
		out, err = exec.Command("curl", append(args, "-H", "Host: other.test", url)...).CombinedOutput()
		if err != nil || !strings.HasSuffix(string(out), "["+c.fronted+"]") {
			t.Errorf("curl %s fronting other.test inside TLS for inspect.test: %v %q, want %s", c.proto, err, out, c.fronted)
		}
	}
}
