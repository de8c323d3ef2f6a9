/* One decision, two attach types.
 *
 * Every hook body is written once, as an __always_inline function taking
 * the hook's arguments, the previous program's return value (ret) and the
 * mechanism it runs under (mech). WATCHER_HOOK then emits two thin
 * programs calling it:
 *
 *   SEC("lsm/<hook>")            lsm_<hook>:  where `bpf` is an active LSM;
 *   SEC("fmod_ret/<security_fn>") fmod_<hook>: BPF_MODIFY_RETURN on the
 *                                 kernel's security_* function, where BPF
 *                                 LSM is built but not enabled: a non-zero
 *                                 return skips the function and becomes
 *                                 its result, so the refusal happens
 *                                 before the operation all the same.
 *
 * Both see the same arguments followed by the previous program's return
 * value. The Go loader (internal/enforce/lsm) picks one per hook. Bodies
 * must use only what both program types may: bpf_d_path only on hooks the
 * kernel allows it for tracing programs (security_file_open,
 * security_path_truncate); elsewhere the path walk of pathwalk.h.
 *
 * Events carry the mechanism in their kind: kind + EV_FMOD_RET for
 * fmod_ret programs, so the ledger says which layer refused.
 */
#pragma once

#define MECH_LSM 0
#define EV_FMOD_RET 64 /* added to an LSM event kind by fmod_ret programs */
#define EV_FENTRY 128  /* added by the fentry programs that kill at a syscall's entry (lsm_entry.h) */

#define WATCHER_HOOK(hook, target, call, args...)                         \
	SEC("lsm/" #hook)                                                 \
	int BPF_PROG(lsm_##hook, args)                                    \
	{                                                                 \
		const __u32 mech = MECH_LSM;                              \
		return call;                                              \
	}                                                                 \
	SEC("fmod_ret/" #target)                                          \
	int BPF_PROG(fmod_##hook, args)                                   \
	{                                                                 \
		const __u32 mech = EV_FMOD_RET;                           \
		return call;                                              \
	}
