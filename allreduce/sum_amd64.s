#include "textflag.h"

// Element-wise sums over whole 128-byte blocks, four YMM registers at a time: one IEEE add
// per element, as the Go loop does, so results are bit-identical to it.
//
// SUMBLOCKS(FIRST, SECOND, MOV, ADD, LOOP, DONE) sets dst = FIRST + SECOND, where FIRST and
// SECOND are DI (dst) and SI (src) in either order: where both elements are NaN, the
// first operand's payload survives, so the order is part of the result. dst + src is what
// a rank computes when its own operand comes first; src + dst when the received one does
// (the higher rank of a recursive-doubling exchange), so that both ranks hold the same bits.
#define SUMBLOCKS(FIRST, SECOND, MOV, ADD, LOOP, DONE) \
	MOVQ dst+0(FP), DI \
	MOVQ src+8(FP), SI \
	MOVQ blocks+16(FP), CX \
	TESTQ CX, CX \
	JZ   DONE \
LOOP: \
	MOV (FIRST), Y0 \
	MOV 32(FIRST), Y1 \
	MOV 64(FIRST), Y2 \
	MOV 96(FIRST), Y3 \
	ADD (SECOND), Y0, Y0 \
	ADD 32(SECOND), Y1, Y1 \
	ADD 64(SECOND), Y2, Y2 \
	ADD 96(SECOND), Y3, Y3 \
	MOV Y0, (DI) \
	MOV Y1, 32(DI) \
	MOV Y2, 64(DI) \
	MOV Y3, 96(DI) \
	ADDQ $128, DI \
	ADDQ $128, SI \
	DECQ CX \
	JNZ  LOOP \
	VZEROUPPER \
DONE: \
	RET

// func addF32AVX2(dst, src unsafe.Pointer, blocks int)
TEXT ·addF32AVX2(SB), NOSPLIT, $0-24
	SUMBLOCKS(DI, SI, VMOVUPS, VADDPS, loop32, done32)

// func addF64AVX2(dst, src unsafe.Pointer, blocks int)
TEXT ·addF64AVX2(SB), NOSPLIT, $0-24
	SUMBLOCKS(DI, SI, VMOVUPD, VADDPD, loop64, done64)

// func addI64AVX2(dst, src unsafe.Pointer, blocks int)
TEXT ·addI64AVX2(SB), NOSPLIT, $0-24
	SUMBLOCKS(DI, SI, VMOVDQU, VPADDQ, loopi, donei)

// func addF32AVX2Rev(dst, src unsafe.Pointer, blocks int)
TEXT ·addF32AVX2Rev(SB), NOSPLIT, $0-24
	SUMBLOCKS(SI, DI, VMOVUPS, VADDPS, loop32r, done32r)

// func addF64AVX2Rev(dst, src unsafe.Pointer, blocks int)
TEXT ·addF64AVX2Rev(SB), NOSPLIT, $0-24
	SUMBLOCKS(SI, DI, VMOVUPD, VADDPD, loop64r, done64r)
