package policy

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestRequireParsesAndRejectsUnknownItems(t *testing.T) {
	head := "version: 1\nsandboxes:\n  - name: a\n    select: {cgroups: [/a]}\n    preset: restricted\n"
	p, err := Parse("p.yaml", []byte(head+"    require: [no_new_privs, cap_drop_all, readonly_root]\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Requirement{RequireNoNewPrivs, RequireCapDropAll, RequireReadonlyRoot}
	if got := p.Sandbox("a").Require; !slices.Equal(got, want) {
		t.Fatalf("require %v, want %v", got, want)
	}
	// A neighbour without the field requires nothing.
	p, err = Parse("p.yaml", []byte(head))
	if err != nil || p.Sandbox("a").Require != nil {
		t.Fatalf("require %v, err %v", p.Sandbox("a").Require, err)
	}
	for _, c := range []struct{ body, field, msg string }{
		{"    require: [no_new_privs, readonly_rootfs]\n", "sandboxes[0].require[1]", `unknown requirement "readonly_rootfs" (want one of no_new_privs, cap_drop_all,`},
		{"    require: [seccomp, seccomp]\n", "sandboxes[0].require[1]", "listed twice"},
		{"    require: no_new_privs\n", "sandboxes[0].require", "sequence is expected"},
	} {
		_, err := Parse("p.yaml", []byte(head+c.body))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Line != 6 || !strings.Contains(fe.Msg, c.msg) || (fe.Field != "" && fe.Field != c.field) {
			t.Errorf("%q: got %v, want p.yaml:6: %s: ...%s...", c.body, err, c.field, c.msg)
		}
	}
}
