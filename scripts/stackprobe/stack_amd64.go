package main

const supported = true

// stackBounds returns the current goroutine's stack bounds (getg_amd64.s).
func stackBounds() (lo, hi uintptr)
