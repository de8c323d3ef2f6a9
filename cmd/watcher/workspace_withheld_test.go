package main

import (
	"bytes"
	"testing"

	"github.com/watcherhq/watcher/internal/workspace"
)

func TestWorkspaceWithheldEscapesSandboxNames(t *testing.T) {
	testOutputs(t, []outputCase{{"workspace commit withheld", func(n string) string {
		var b bytes.Buffer
		printWithheld(&b, []workspace.Note{
			{Action: workspace.Stripped, Path: "/work/" + n, What: "setuid bit"},
			{Action: workspace.Stripped, Path: "/work/plain", What: "xattr security." + n},
			{Action: workspace.Refused, Path: "/work/" + n + "-dev", What: "character device 1:3"},
			{Action: workspace.Reowned, Path: "/work/x", What: "owner 0:0, given 1000:1000"},
		})
		return b.String()
	}}})
}
