package main

import (
	"os"
	"testing"
)

func TestFsync_SyncsEveryBlockAndCleansUp(t *testing.T) {
	dir := t.TempDir()
	res, err := runFsync(fsyncConfig{Dir: dir, Count: 20, Block: 64})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(res.Sync.v); got != 20 {
		t.Errorf("%d fdatasync samples, want one per block (20)", got)
	}
	if res.Sync.quantile(0.5) <= 0 {
		t.Errorf("median fdatasync %v ms, want a positive duration", res.Sync.quantile(0.5))
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("left %d files in the measured directory, want none", len(left))
	}
}

func TestFsync_RefusesAMissingDirectory(t *testing.T) {
	if _, err := runFsync(fsyncConfig{Dir: t.TempDir() + "/missing", Count: 1, Block: 1}); err == nil {
		t.Fatal("runFsync into a missing directory succeeded, want an error naming it")
	}
}
