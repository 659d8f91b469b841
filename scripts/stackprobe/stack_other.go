//go:build !amd64

package main

const supported = false

func stackBounds() (lo, hi uintptr) { return 0, 0 }
