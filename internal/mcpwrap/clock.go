package mcpwrap

import "time"

func now() time.Time { return time.Now().UTC() }
