#include "textflag.h"

// func syscall3(nr, a1, a2, a3 uintptr) uintptr
TEXT ·syscall3(SB),NOSPLIT,$0-40
	MOVQ nr+0(FP), AX
	MOVQ a1+8(FP), BX
	MOVQ a2+16(FP), CX
	MOVQ a3+24(FP), DX
	INT $0x80
	MOVQ AX, ret+32(FP)
	RET

// func syscall6(nr, a1, a2, a3, a4, a5, a6 uintptr) uintptr
// The sixth argument goes in BP: saved in the frame and restored.
TEXT ·syscall6(SB),NOSPLIT,$8-64
	MOVQ BP, 0(SP)
	MOVQ nr+0(FP), AX
	MOVQ a1+8(FP), BX
	MOVQ a2+16(FP), CX
	MOVQ a3+24(FP), DX
	MOVQ a4+32(FP), SI
	MOVQ a5+40(FP), DI
	MOVQ a6+48(FP), BP
	INT $0x80
	MOVQ 0(SP), BP
	MOVQ AX, ret+56(FP)
	RET
