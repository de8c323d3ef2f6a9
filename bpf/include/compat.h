/* x86 syscall tables: how a program tells an i386 or x32 call from an x86_64 one. */
#pragma once

#define TS_COMPAT 0x0002           /* thread_info.status: an i386 syscall (int 0x80, sysenter) is running */
#define X32_SYSCALL_BIT 0x40000000 /* x32 calls: x86_64 numbers with this bit set */
