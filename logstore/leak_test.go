package logstore

import "runtime"

func runtimeGoroutines() int { return runtime.NumGoroutine() }

func goroutineDump() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

func testingProcs() int { return runtime.GOMAXPROCS(0) }
