package main

import (
	"fmt"
	"os"
)

// runMCPWrap is a stand-in until `watcher mcp wrap` is merged (the
// coordinator deletes this file then).
func runMCPWrap(args []string) int {
	fmt.Fprintln(os.Stderr, "watcher mcp wrap: not built yet")
	return 2
}
