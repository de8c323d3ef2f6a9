package policy

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestListenPresetsBlockEveryPort(t *testing.T) {
	for _, name := range PresetNames() {
		sb, err := Preset(name)
		if err != nil {
			t.Fatalf("preset %q: %v", name, err)
		}
		if sb.Listen.Action != ActionBlock || len(sb.Listen.Ports) != 0 {
			t.Errorf("preset %q: listen %+v, want no ports and block", name, sb.Listen)
		}
	}
}

func TestListenOverrideKeepsPresetAction(t *testing.T) {
	p, err := Parse("p.yaml", []byte(`version: 1
sandboxes:
  - name: web
    select: {cgroups: [/web]}
    preset: dev
    listen:
      ports: ["8080", 9000-9100, 443]
  - name: other
    select: {cgroups: [/other]}
    preset: dev
`))
	if err != nil {
		t.Fatal(err)
	}
	web, other := p.Sandboxes[0].Listen, p.Sandboxes[1].Listen
	if web.Action != ActionBlock || fmt.Sprint(web.Ports) != "[8080 9000-9100 443]" {
		t.Errorf("web listen %+v, want the three ports and block", web)
	}
	if len(other.Ports) != 0 || other.Action != ActionBlock {
		t.Errorf("other sandbox listen %+v: the first sandbox's ports leaked into the preset", other)
	}
}

func TestListenBadValues(t *testing.T) {
	head := "version: 1\nsandboxes:\n  - name: a\n    select: {cgroups: [/a]}\n    preset: restricted\n    listen:\n"
	many := make([]string, MaxListenPorts+1)
	for i := range many {
		many[i] = fmt.Sprint(8000 + i)
	}
	cases := []struct{ name, body, field, msg string }{
		{"kill", "      action: kill\n", "sandboxes[0].listen.action", "cannot kill"},
		{"unknown action", "      action: deny\n", "sandboxes[0].listen.action", "want block, record or allow"},
		{"port zero", "      ports: [0]\n", "sandboxes[0].listen.ports[0]", "out of range"},
		{"reversed", "      ports: [\"9100-9000\"]\n", "sandboxes[0].listen.ports[0]", "start above end"},
		{"not a port", "      ports: [http]\n", "sandboxes[0].listen.ports[0]", "not a port number"},
		{"too many", "      ports: [" + strings.Join(many, ", ") + "]\n", "sandboxes[0].listen.ports", "at most 16"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(head+c.body))
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v, want a FieldError", err)
			}
			if fe.Field != c.field || !strings.Contains(fe.Msg, c.msg) {
				t.Errorf("got %s, want %s: ...%s...", err, c.field, c.msg)
			}
		})
	}
}
