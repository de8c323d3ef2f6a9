/* Terminal injection: TIOCSTI and TIOCLINUX. */
#pragma once

#define TIOCSTI 0x5412
#define TIOCLINUX 0x541C

/* TIOCSTI pushes bytes into a terminal's input as if typed (the operator's
 * shell runs them); TIOCLINUX's selection paste does the same on a virtual
 * console. Refused on every terminal, the sandbox's own included: nothing
 * everyday needs them. 32-bit callers reach the same hook (compat_ioctl
 * calls security_file_ioctl on 6.1; file_ioctl_compat where the kernel has
 * it judges below too). */
static __always_inline int decide_file_ioctl(__u32 mech, struct file *file, unsigned int cmd, int ret)
{
	if (ret)
		return ret;
	if (cmd == FIOSETOWN_ || cmd == SIOCSPGRP_)
		record_fown_setter(file);
	if (cmd != TIOCSTI && cmd != TIOCLINUX)
		return 0;
	return judge_op(mech, LSM_OP_TTY_INJECT, EV_OPERATION, cmd);
}
WATCHER_HOOK(file_ioctl, security_file_ioctl, decide_file_ioctl(mech, file, cmd, ret),
	     struct file *file, unsigned int cmd, unsigned long arg, int ret)
WATCHER_HOOK(file_ioctl_compat, security_file_ioctl_compat, decide_file_ioctl(mech, file, cmd, ret),
	     struct file *file, unsigned int cmd, unsigned long arg, int ret)
