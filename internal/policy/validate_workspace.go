package policy

import (
	"regexp"
)

var ioDevice = regexp.MustCompile(`^(/dev/\S+|\d+:\d+)$`)

func (c *checker) byteSize(at path, b ByteSize) {
	if b.invalid != "" {
		c.add(at, "%s", b.invalid)
	}
}

// workspaceValues checks the workspace options and limits present in a
// sandbox as written.
func (c *checker) workspaceValues(at path, sb *Sandbox) {
	wo := at.key("workspace_options")
	o := &sb.WorkspaceOptions
	if m := o.Mode; m != "" && m != WorkspaceDirect && m != WorkspaceOverlay {
		c.add(wo.key("mode"), "%q: want direct or overlay", m)
	}
	if o.StateDir != "" {
		c.absPath(wo.key("state_dir"), o.StateDir, false)
	}
	if o.MaxSnapshots < 0 {
		c.add(wo.key("max_snapshots"), "must not be negative")
	}
	c.byteSize(wo.key("max_snapshot_bytes"), o.MaxSnapshotBytes)

	li := at.key("limits")
	l := &sb.Limits
	if l.CPU < 0 || l.CPU > 4096 {
		c.add(li.key("cpu"), "%v out of range (cores, e.g. 1.5; 0 = unlimited)", l.CPU)
	} else if l.CPU > 0 && l.CPU < 0.01 {
		c.add(li.key("cpu"), "%v is below the minimum of 0.01 cores", l.CPU)
	}
	c.byteSize(li.key("memory"), l.Memory)
	c.byteSize(li.key("memory_high"), l.MemoryHigh)
	if l.Memory.Bytes > 0 && l.Memory.Bytes < 1<<20 {
		c.add(li.key("memory"), "%d bytes is below the minimum of 1M", l.Memory.Bytes)
	}
	if l.Memory.Bytes > 0 && l.MemoryHigh.Bytes > l.Memory.Bytes {
		c.add(li.key("memory_high"), "%s is above memory (%s): memory_high throttles below the hard limit", l.MemoryHigh, l.Memory)
	}
	if l.PIDs < 0 {
		c.add(li.key("pids"), "must not be negative")
	}
	for i, d := range l.IO {
		ip := li.key("io").idx(i)
		if !ioDevice.MatchString(d.Device) {
			c.add(ip.key("device"), "%q: want a block device path (/dev/vda) or MAJOR:MINOR", d.Device)
		}
		c.byteSize(ip.key("read_bps"), d.ReadBPS)
		c.byteSize(ip.key("write_bps"), d.WriteBPS)
		if d.ReadIOPS < 0 {
			c.add(ip.key("read_iops"), "must not be negative")
		}
		if d.WriteIOPS < 0 {
			c.add(ip.key("write_iops"), "must not be negative")
		}
		if d.ReadBPS.Bytes == 0 && d.WriteBPS.Bytes == 0 && d.ReadIOPS == 0 && d.WriteIOPS == 0 {
			c.add(ip, "sets no limit (give read_bps, write_bps, read_iops or write_iops)")
		}
	}
}

// workspaceRequired checks relations of an effective sandbox.
func (c *checker) workspaceRequired(at path, sb *Sandbox) {
	if sb.WorkspaceOptions.Mode == WorkspaceOverlay && len(sb.Workspace) == 0 {
		c.add(at.key("workspace_options", "mode"), "overlay needs at least one workspace directory")
	}
}
