#include "textflag.h"

// func stackBounds() (lo, hi uintptr)
// The current goroutine's g is at 0(TLS); its first field is the stack
// (lo, hi).
TEXT ·stackBounds(SB), NOSPLIT, $0-16
	MOVQ (TLS), AX
	MOVQ 0(AX), BX
	MOVQ BX, lo+0(FP)
	MOVQ 8(AX), BX
	MOVQ BX, hi+8(FP)
	RET
