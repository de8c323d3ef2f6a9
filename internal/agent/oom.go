package agent

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// agentOOMScoreAdj is the agent's OOM score adjustment, as the systemd unit
// sets it (OOMScoreAdjust=-900): a sandbox that runs the host out of memory
// with many processes, each smaller than the agent, would otherwise make
// the kernel's OOM killer pick the agent first and end the record.
const agentOOMScoreAdj = -900

// lowerOOMScore lowers the adjustment in file (/proc/self/oom_score_adj) to
// target when it is higher; an operator's lower value stays. It returns the
// value found and whether it was changed.
func lowerOOMScore(file string, target int) (was int, changed bool, err error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false, fmt.Errorf("read oom_score_adj: %w", err)
	}
	was, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, false, fmt.Errorf("parse %s: %w", file, err)
	}
	if was <= target {
		return was, false, nil
	}
	if err := os.WriteFile(file, []byte(strconv.Itoa(target)), 0); err != nil {
		return was, false, fmt.Errorf("lower oom_score_adj: %w", err)
	}
	return was, true, nil
}
