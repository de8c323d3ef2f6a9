/* Terminals other than the sandbox's own (issue 25): a terminal belongs to
 * the session whose leader controls it. A sandbox may open its own
 * controlling terminal, a terminal no session controls (the slave of a
 * pty it just made, before setsid and TIOCSCTTY), and one whose session
 * leader is a task of its subtree; a terminal controlled from outside (the
 * operator's shell, a host login) is refused by the caller. Judged on the
 * tty's kernel state (its session's struct pid), not on device numbers,
 * which say nothing of the owner. */
#ifndef WATCHER_TTY_H
#define WATCHER_TTY_H

#define DEVPTS_SUPER_MAGIC_ 0x1cd1
#define TTY_PTS_MAJOR_FIRST 136 /* UNIX98_PTY_SLAVE_MAJOR */
#define TTY_PTS_MAJOR_LAST 143  /* + UNIX98_PTY_MAJOR_COUNT - 1 */
#define TTY_MINORBITS 20
#define TTY_S_IFMT 00170000
#define TTY_S_IFCHR 0020000

/* Before Linux 5.17 the session was a member of tty_struct itself. */
struct tty_struct___flat {
	struct pid *session;
} __attribute__((preserve_access_index));

/* tty_pts_slave: the inode is a pty slave (/dev/pts/N). */
static __always_inline bool tty_pts_slave(__u32 mode, __u32 rdev)
{
	__u32 major = rdev >> TTY_MINORBITS;
	return (mode & TTY_S_IFMT) == TTY_S_IFCHR && major >= TTY_PTS_MAJOR_FIRST && major <= TTY_PTS_MAJOR_LAST;
}

static __always_inline struct pid *tty_session(struct tty_struct *tty)
{
	if (bpf_core_field_exists(tty->ctrl))
		return BPF_CORE_READ(tty, ctrl.session);
	return BPF_CORE_READ((struct tty_struct___flat *)tty, session);
}

/* tty_foreign_leader returns the leader of the session that controls tty
 * when tty is not the caller's own controlling terminal, else NULL (its
 * own terminal, no controlling session, or the leader is gone). The
 * caller judges the leader against its subtree. */
static __always_inline struct task_struct *tty_foreign_leader(struct tty_struct *tty)
{
	if (!tty)
		return NULL;
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task_btf();
	if (BPF_CORE_READ(cur, signal, tty) == tty)
		return NULL;
	struct pid *sid = tty_session(tty);
	if (!sid)
		return NULL;
	/* The session id is its leader's pid: the leader is the task on the
	 * PIDTYPE_PID list of that struct pid (pid_links[PIDTYPE_PID]). */
	struct hlist_node *first = BPF_CORE_READ(sid, tasks[0].first);
	if (!first)
		return NULL;
	return (struct task_struct *)((void *)first - bpf_core_field_offset(struct task_struct, pid_links));
}

#endif
