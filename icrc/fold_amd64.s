#include "textflag.h"

// CRC-32/IEEE by folding (Intel, "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ", 2009), bit-reflected: a 128-bit lane X is
// carried D bits further along the message as
// clmul(X.lo, x^(D+32) mod P) ^ clmul(X.hi, x^(D-32) mod P), each constant
// bit-reflected and shifted left by one (TestFoldConstants derives them).
// Four 512-bit registers take 256 bytes a round (D = 2048 per lane); they
// are folded into one (D = 512), which takes the remaining 64-byte blocks,
// its four lanes into one (D = 128), which takes the remaining 16-byte
// blocks, and the 128-bit remainder is reduced to 32 bits by Barrett
// reduction. The length is a multiple of 16, at least 256.

DATA k2048<>+0(SB)/8, $0x11542778a
DATA k2048<>+8(SB)/8, $0x1322d1430
DATA k2048<>+16(SB)/8, $0x11542778a
DATA k2048<>+24(SB)/8, $0x1322d1430
DATA k2048<>+32(SB)/8, $0x11542778a
DATA k2048<>+40(SB)/8, $0x1322d1430
DATA k2048<>+48(SB)/8, $0x11542778a
DATA k2048<>+56(SB)/8, $0x1322d1430
GLOBL k2048<>(SB), RODATA, $64

DATA k512<>+0(SB)/8, $0x154442bd4
DATA k512<>+8(SB)/8, $0x1c6e41596
DATA k512<>+16(SB)/8, $0x154442bd4
DATA k512<>+24(SB)/8, $0x1c6e41596
DATA k512<>+32(SB)/8, $0x154442bd4
DATA k512<>+40(SB)/8, $0x1c6e41596
DATA k512<>+48(SB)/8, $0x154442bd4
DATA k512<>+56(SB)/8, $0x1c6e41596
GLOBL k512<>(SB), RODATA, $64

DATA k128<>+0(SB)/8, $0x1751997d0
DATA k128<>+8(SB)/8, $0x0ccaa009e
GLOBL k128<>(SB), RODATA, $16

// x^64 mod P, for the step from 96 to 64 bits.
DATA k64<>+0(SB)/8, $0x163cd6124
GLOBL k64<>(SB), RODATA, $8

// P (reflected, 33 bits) and Barrett's mu = floor(x^64 / P) (reflected).
DATA barrett<>+0(SB)/8, $0x1db710641
DATA barrett<>+8(SB)/8, $0x1f7011641
GLOBL barrett<>(SB), RODATA, $16

// FOLD carries the lanes of x one step (constants k) and adds y: t is
// scratch.
#define FOLD(k, x, y, t) \
	VPCLMULQDQ $0x00, k, x, t; \
	VPCLMULQDQ $0x11, k, x, x; \
	VPTERNLOGD $0x96, t, y, x

// FOLD128 is FOLD for one 128-bit lane (SSE), constants in X8.
#define FOLD128(x, y) \
	MOVOA     x, X5; \
	PCLMULQDQ $0x00, X8, x; \
	PCLMULQDQ $0x11, X8, X5; \
	PXOR      X5, x; \
	PXOR      y, x

// LANES folds the four lanes of Z0 into the 128-bit X0 (and loads the
// 128-bit constants into X8); 16-byte blocks then fold into X0 one by one.
#define LANES \
	VEXTRACTF32X4 $1, Z0, X1; \
	VEXTRACTF32X4 $2, Z0, X2; \
	VEXTRACTF32X4 $3, Z0, X3; \
	VZEROUPPER; \
	MOVOU   k128<>(SB), X8; \
	FOLD128(X0, X1); \
	FOLD128(X0, X2); \
	FOLD128(X0, X3)

// BARRETT reduces the 128-bit X0 (constants of k128 in X8) to the 32-bit
// CRC register in AX.
#define BARRETT \
	PCMPEQB   X3, X3; \
	MOVOA     X8, X1; \
	PCLMULQDQ $0x01, X0, X1; \
	PSRLDQ    $8, X0; \
	PXOR      X1, X0; \
	MOVOA     X0, X2; \
	MOVQ      k64<>(SB), X1; \
	PSRLQ     $32, X3; \
	PSRLDQ    $4, X2; \
	PAND      X3, X0; \
	PCLMULQDQ $0x00, X1, X0; \
	PXOR      X2, X0; \
	MOVOU     barrett<>(SB), X1; \
	MOVOA     X0, X2; \
	PAND      X3, X0; \
	PCLMULQDQ $0x10, X1, X0; \
	PAND      X3, X0; \
	PCLMULQDQ $0x00, X1, X0; \
	PXOR      X2, X0; \
	PEXTRD    $1, X0, AX

// func foldUpdate(crc uint32, p []byte) uint32
TEXT ·foldUpdate(SB), NOSPLIT, $0-36
	MOVL      crc+0(FP), AX
	MOVQ      p_base+8(FP), SI
	MOVQ      p_len+16(FP), CX
	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VPXORQ    Z4, Z4, Z4
	VMOVD     AX, X4
	VPXORQ    Z4, Z0, Z0
	ADDQ      $256, SI
	SUBQ      $256, CX
	VMOVDQU64 k2048<>(SB), Z8
	CMPQ      CX, $256
	JB        u4

u256:
	VMOVDQU64 0(SI), Z4
	VMOVDQU64 64(SI), Z5
	VMOVDQU64 128(SI), Z6
	VMOVDQU64 192(SI), Z7
	FOLD(Z8, Z0, Z4, Z9)
	FOLD(Z8, Z1, Z5, Z10)
	FOLD(Z8, Z2, Z6, Z11)
	FOLD(Z8, Z3, Z7, Z12)
	ADDQ      $256, SI
	SUBQ      $256, CX
	CMPQ      CX, $256
	JAE       u256

u4:
	VMOVDQU64 k512<>(SB), Z8
	FOLD(Z8, Z0, Z1, Z9)
	FOLD(Z8, Z0, Z2, Z9)
	FOLD(Z8, Z0, Z3, Z9)

u64:
	CMPQ      CX, $64
	JB        udone
	VMOVDQU64 0(SI), Z4
	FOLD(Z8, Z0, Z4, Z9)
	ADDQ      $64, SI
	SUBQ      $64, CX
	JMP       u64

udone:
	LANES

u16:
	CMPQ      CX, $16
	JB        ubarrett
	MOVOU     0(SI), X1
	FOLD128(X0, X1)
	ADDQ      $16, SI
	SUBQ      $16, CX
	JMP       u16

ubarrett:
	BARRETT
	MOVL      AX, ret+32(FP)
	RET

// func foldCopy(crc uint32, dst, src []byte) uint32
TEXT ·foldCopy(SB), NOSPLIT, $0-60
	MOVL      crc+0(FP), AX
	MOVQ      dst_base+8(FP), DI
	MOVQ      src_base+32(FP), SI
	MOVQ      src_len+40(FP), CX
	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVDQU64 Z0, 0(DI)
	VMOVDQU64 Z1, 64(DI)
	VMOVDQU64 Z2, 128(DI)
	VMOVDQU64 Z3, 192(DI)
	VPXORQ    Z4, Z4, Z4
	VMOVD     AX, X4
	VPXORQ    Z4, Z0, Z0
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $256, CX
	VMOVDQU64 k2048<>(SB), Z8
	CMPQ      CX, $256
	JB        c4

c256:
	VMOVDQU64 0(SI), Z4
	VMOVDQU64 64(SI), Z5
	VMOVDQU64 128(SI), Z6
	VMOVDQU64 192(SI), Z7
	VMOVDQU64 Z4, 0(DI)
	VMOVDQU64 Z5, 64(DI)
	VMOVDQU64 Z6, 128(DI)
	VMOVDQU64 Z7, 192(DI)
	FOLD(Z8, Z0, Z4, Z9)
	FOLD(Z8, Z1, Z5, Z10)
	FOLD(Z8, Z2, Z6, Z11)
	FOLD(Z8, Z3, Z7, Z12)
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $256, CX
	CMPQ      CX, $256
	JAE       c256

c4:
	VMOVDQU64 k512<>(SB), Z8
	FOLD(Z8, Z0, Z1, Z9)
	FOLD(Z8, Z0, Z2, Z9)
	FOLD(Z8, Z0, Z3, Z9)

c64:
	CMPQ      CX, $64
	JB        cdone
	VMOVDQU64 0(SI), Z4
	VMOVDQU64 Z4, 0(DI)
	FOLD(Z8, Z0, Z4, Z9)
	ADDQ      $64, SI
	ADDQ      $64, DI
	SUBQ      $64, CX
	JMP       c64

cdone:
	LANES

c16:
	CMPQ      CX, $16
	JB        cbarrett
	MOVOU     0(SI), X1
	MOVOU     X1, 0(DI)
	FOLD128(X0, X1)
	ADDQ      $16, SI
	ADDQ      $16, DI
	SUBQ      $16, CX
	JMP       c16

cbarrett:
	BARRETT
	MOVL      AX, ret+56(FP)
	RET
