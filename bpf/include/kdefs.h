/* Kernel constants both the LSM hooks and the backstop use (macros: not in BTF). */
#pragma once

#define SIGKILL 9
#define FMODE_WRITE 0x2
#define PROC_SUPER_MAGIC 0x9fa0

/* Commands that set a file's SIGIO/SIGURG owner: fcntl's, then ioctl's. */
#define F_SETOWN_ 8
#define F_SETOWN_EX_ 15
#define FIOSETOWN_ 0x8901
#define SIOCSPGRP_ 0x8902

/* The generation of an inode rule written without the file's i_generation
 * (procfs, overlayfs, btrfs, network filesystems): the number alone
 * decides. See internal/enforce/fileident.go. */
#define GEN_ANY 0xffffffffu
