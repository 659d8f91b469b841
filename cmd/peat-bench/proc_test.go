package main

import (
	"os"
	"slices"
	"testing"
	"time"
)

// A site's CPU per message is the sum over its nodes: cpuOf adds every
// process named, and a process that is gone adds nothing.
func TestCPUOf_SumsTheProcesses(t *testing.T) {
	self := os.Getpid()
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; { // use some CPU
	}
	one := cpuOf([]int{self})
	if one <= 0 {
		t.Fatalf("cpuOf(self) = %v after 100 ms of work", one)
	}
	if two := cpuOf([]int{self, self}); two < 2*one {
		t.Errorf("cpuOf(self, self) = %v, want at least twice %v", two, one)
	}
	if gone := cpuOf([]int{1<<22 + 1}); gone != 0 {
		t.Errorf("cpuOf(a pid that does not exist) = %v, want 0", gone)
	}
}

func TestParsePIDs(t *testing.T) {
	if got, err := parsePIDs(""); err != nil || got != nil {
		t.Errorf(`parsePIDs("") = %v, %v; want none`, got, err)
	}
	if got, err := parsePIDs("12, 34"); err != nil || !slices.Equal(got, []int{12, 34}) {
		t.Errorf(`parsePIDs("12, 34") = %v, %v`, got, err)
	}
	for _, bad := range []string{"12,x", "0", "-3"} {
		if _, err := parsePIDs(bad); err == nil {
			t.Errorf("parsePIDs(%q) took it", bad)
		}
	}
}
