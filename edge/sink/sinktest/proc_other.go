//go:build !linux

package sinktest

import "os/exec"

// dieWithParent: only Linux has a parent-death signal; elsewhere the
// test's cleanup stops the child.
func dieWithParent(*exec.Cmd) {}
