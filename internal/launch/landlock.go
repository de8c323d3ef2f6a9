package launch

import (
	"errors"
	"fmt"
	"os"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsyscall "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// LandlockABI returns the kernel's Landlock ABI version, 0 when Landlock is
// unavailable (not built, or not in the active LSM list).
func LandlockABI() int {
	v, err := llsyscall.LandlockGetABIVersion()
	if err != nil {
		return 0
	}
	return v
}

// landlockConfigs are go-landlock's presets by ABI version.
var landlockConfigs = []landlock.Config{
	{}, landlock.V1, landlock.V2, landlock.V3, landlock.V4, landlock.V5, landlock.V6,
	landlock.V7, landlock.V8, landlock.V9, landlock.V10, landlock.V11,
}

// landlockConfig picks the strongest file access set the kernel offers
// (the newest preset not above its ABI). Network rights are left to the
// egress layer; IPC scoping is added when asked for.
func landlockConfig(abi int, scopeIPC bool) landlock.Config {
	if abi >= len(landlockConfigs) {
		abi = len(landlockConfigs) - 1
	}
	preset := landlockConfigs[abi]
	cfg := landlock.Config{HandledAccessFS: preset.HandledAccessFS}
	if scopeIPC {
		cfg.Scoped = preset.Scoped
	}
	return cfg
}

// landlockRules turns file rules into go-landlock rules. Directories get
// directory rules; files get file rules (Landlock refuses directory
// rights on files).
func landlockRules(r *FileRules) ([]landlock.Rule, int, error) {
	var rules []landlock.Rule
	n := 0
	add := func(paths []string, dir, file func(...string) landlock.FSRule, ioctl bool) error {
		for _, p := range paths {
			st, err := os.Stat(p)
			if err != nil {
				if r.IgnoreMissing && errors.Is(err, os.ErrNotExist) {
					continue
				}
				return fmt.Errorf("landlock rule %s: %w", p, err)
			}
			var rule landlock.FSRule
			if st.IsDir() {
				rule = dir(p)
			} else {
				rule = file(p)
			}
			if ioctl {
				rule = rule.WithIoctlDev()
			}
			rules = append(rules, rule)
			n++
		}
		return nil
	}
	if err := add(r.ReadOnly, landlock.RODirs, landlock.ROFiles, false); err != nil {
		return nil, 0, err
	}
	if err := add(r.ReadWrite, landlock.RWDirs, landlock.RWFiles, false); err != nil {
		return nil, 0, err
	}
	if err := add(r.Devices, landlock.RWDirs, landlock.RWFiles, true); err != nil {
		return nil, 0, err
	}
	return rules, n, nil
}

// scopeNames lists a ruleset's IPC scopes, for the verdict.
func scopeNames(cfg landlock.Config) []string {
	var out []string
	if cfg.Scoped&llsyscall.ScopeSignal != 0 {
		out = append(out, "signal")
	}
	if cfg.Scoped&llsyscall.ScopeAbstractUnixSocket != 0 {
		out = append(out, "abstract-unix")
	}
	return out
}

// restrictLandlock creates the ruleset and enforces it on the calling
// thread, which must be locked and must exec next. no_new_privs must be
// set already. With r nil the ruleset handles no file access: only the
// IPC scopes (when scope is set and the kernel has them).
func restrictLandlock(r *FileRules, scope bool, applied *Applied) error {
	abi := LandlockABI()
	applied.LandlockABI = abi
	if r == nil {
		if !scope || abi < 6 {
			return nil
		}
		cfg := landlock.Config{Scoped: landlockConfig(abi, true).Scoped}
		fd, flags, err := cfg.NewRulesetFD()
		if err != nil {
			return fmt.Errorf("landlock scope ruleset: %w", err)
		}
		defer unix.Close(fd)
		if err := llsyscall.LandlockRestrictSelf(fd, flags); err != nil {
			return fmt.Errorf("landlock restrict: %w", err)
		}
		applied.Scoped = scopeNames(cfg)
		return nil
	}
	if abi == 0 {
		return errors.New("landlock: not available on this kernel")
	}
	cfg := landlockConfig(abi, scope)
	rules, n, err := landlockRules(r)
	if err != nil {
		return err
	}
	var plan FilePlan
	if r.Derive {
		if home, err := os.UserHomeDir(); err == nil {
			PrecreateWritable(r.Files, home)
		}
		if plan, err = PlanFiles(r); err != nil {
			return err
		}
	}
	fd, flags, err := cfg.NewRulesetFD(rules...)
	if err != nil {
		return fmt.Errorf("landlock ruleset: %w", err)
	}
	if fd < 0 {
		return errors.New("landlock: nothing to enforce")
	}
	defer unix.Close(fd)
	if r.Derive {
		added, err := addPlanRules(fd, uint64(cfg.HandledAccessFS), plan)
		if err != nil {
			return err
		}
		n += added
		applied.LandlockNotes = plan.Notes
	}
	if err := llsyscall.LandlockRestrictSelf(fd, flags); err != nil {
		return fmt.Errorf("landlock restrict: %w", err)
	}
	applied.Landlock = cfg.String()
	applied.LandlockRules = n
	applied.Scoped = scopeNames(cfg)
	return nil
}
