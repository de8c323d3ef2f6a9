package audit

import (
	"slices"
	"testing"
)

func TestRedactStrings(t *testing.T) {
	cases := []struct {
		in, want string
		entropy  bool
	}{
		{"password=hunter2", "password=***", false},
		{"DB_PASSWORD=s3cret other=1", "DB_PASSWORD=*** other=1", false},
		{"https://x.example/cb?access_token=abc123&state=ok", "https://x.example/cb?access_token=***&state=ok", false},
		{"--api-key=AbC", "--api-key=***", false},
		{"Authorization: Bearer eyJhbGciOi.x.y", "Authorization: ***", false},
		{"proxy-authorization: Basic dXNlcjpwYXNz", "proxy-authorization: ***", false},
		{"Cookie: session=abc", "Cookie: ***", false},
		{"git clone https://bob:hunter2@example.com/r.git", "git clone https://bob:***@example.com/r.git", false},
		{"key AKIAIOSFODNN7EXAMPLE here", "key *** here", false},
		{"-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----\ntail", "***\ntail", false},
		{"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----", false},
		{"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "***", true},
		{"ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5", "***", true},
		{"token ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5 in a message", "token *** in a message", false},
		{"github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "***", false},
		// Not secrets: ordinary words, paths, hex digests, UUIDs, authors.
		{"/usr/lib/x86_64-linux-gnu/libLLVMSomethingVeryLong.so.17", "/usr/lib/x86_64-linux-gnu/libLLVMSomethingVeryLong.so.17", true},
		{"3f786850e387550fdab836ed7e6dc881de23001b", "3f786850e387550fdab836ed7e6dc881de23001b", true},
		{"550e8400-e29b-41d4-a716-446655440000", "550e8400-e29b-41d4-a716-446655440000", true},
		{"--author=Jane", "--author=Jane", false},
		{"import os; os.listdir('.')", "import os; os.listdir('.')", true},
		{"PWD=/home/agent", "PWD=/home/agent", false},
		{"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", false}, // message: no entropy rule
	}
	for _, c := range cases {
		got, hit := redactString(c.in, c.entropy)
		if got != c.want || hit != (c.in != c.want) {
			t.Errorf("redactString(%q) = %q, %v; want %q", c.in, got, hit, c.want)
		}
		// Idempotent.
		if again, hit := redactString(got, c.entropy); hit || again != got {
			t.Errorf("second pass over %q changed it to %q", got, again)
		}
	}
}

func TestRedactEvent(t *testing.T) {
	args := []string{"mysql", "--password", "hunter2", "--user=root", "--token=abc"}
	labels := map[string]string{"tool_call": "42", "api_token": "xyz", "note": "password=p"}
	e := Event{
		Process: Process{Args: args},
		Sandbox: Sandbox{Labels: labels},
		Message: "login with password=p4ss",
		Mount:   &MountDetail{Op: "mount", Source: "//user:pw@host/share"},
	}
	if !Redact(&e) {
		t.Fatal("nothing redacted")
	}
	if !slices.Equal(e.Process.Args, []string{"mysql", "--password", "***", "--user=root", "--token=***"}) {
		t.Fatalf("args %q", e.Process.Args)
	}
	if args[2] != "hunter2" || labels["api_token"] != "xyz" {
		t.Fatal("caller's slice or map was changed")
	}
	if e.Sandbox.Labels["api_token"] != "***" || e.Sandbox.Labels["note"] != "password=***" || e.Sandbox.Labels["tool_call"] != "42" {
		t.Fatalf("labels %v", e.Sandbox.Labels)
	}
	if e.Message != "login with password=***" || e.Mount.Source != "//user:***@host/share" {
		t.Fatalf("message %q mount %q", e.Message, e.Mount.Source)
	}
	want := []string{"process.args[2]", "process.args[4]", "message", "sandbox.labels[api_token]", "sandbox.labels[note]", "mount.source"}
	got := append([]string(nil), e.Redacted...)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("Redacted = %v, want %v", e.Redacted, want)
	}
	n := len(e.Redacted)
	if Redact(&e) || len(e.Redacted) != n {
		t.Fatal("second Redact changed the event")
	}
	plain := Event{Process: Process{Args: []string{"ls", "-la", "/tmp"}}, Message: "exec ok"}
	if Redact(&plain) || plain.Redacted != nil {
		t.Fatal("redacted a harmless event")
	}
}
