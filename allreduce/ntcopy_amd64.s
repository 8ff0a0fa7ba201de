#include "textflag.h"

// func copyNT(dst, src unsafe.Pointer, blocks int)
//
// Copies whole 128-byte blocks with non-temporal stores: dst must be 32-byte aligned; src
// need not be. The stores go around this core's caches (see ringCopy), and an SFENCE at the
// end orders them before whatever the caller publishes next.
TEXT ·copyNT(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ blocks+16(FP), CX
	TESTQ CX, CX
	JZ   done
loop:
	VMOVDQU (SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMOVNTDQ Y0, (DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	SFENCE
	VZEROUPPER
done:
	RET
