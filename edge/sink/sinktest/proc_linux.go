package sinktest

import (
	"os/exec"
	"syscall"
)

// dieWithParent kills the child when the test binary dies, even by a
// panic that skips the cleanups: no mosquitto outlives its test.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
