package logstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestStore_RealDiskFull fills a real, small filesystem. It runs only when
// PEAT_TEST_SMALLFS names an empty directory on one (a few hundred MB), e.g.
//
//	mount -t tmpfs -o size=200m tmpfs /mnt/small
//	PEAT_TEST_SMALLFS=/mnt/small go test -run RealDiskFull ./logstore/
//
// Without the reserve Badger dies of SIGBUS writing a table into a sparse
// mmap on a full disk (seen with 40 MB of tmpfs); with it, appends fail with
// ErrNoSpace, nothing stored is lost, and appends resume when space returns.
func TestStore_RealDiskFull(t *testing.T) {
	root := os.Getenv("PEAT_TEST_SMALLFS")
	if root == "" {
		t.Skip("set PEAT_TEST_SMALLFS to an empty directory on a small filesystem")
	}
	dir, err := os.MkdirTemp(root, "logstore-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := testConfig(t)
	cfg.Dir = filepath.Join(dir, "db")
	cfg.MinFreeBytes = 0 // the profile's reserve
	st, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st.space.every = 0
	s := st.Stream("default")
	// A filler file leaves about 30 MB above the reserve, and is deleted
	// later to give space back.
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for {
		free, err := diskFree(dir)
		if err != nil {
			t.Fatal(err)
		}
		if free < uint64(st.space.min)+30<<20 {
			break
		}
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	payload := make([]byte, 1000)
	var lastErr error
	for range 100_000 {
		recs := make([]*Record, 100)
		for j := range recs {
			recs[j] = &Record{Topic: "a", Payload: payload}
		}
		if _, lastErr = s.Append(context.Background(), recs...); lastErr != nil {
			break
		}
	}
	if !errors.Is(lastErr, ErrNoSpace) {
		t.Fatalf("filling the disk ended with %v, want ErrNoSpace", lastErr)
	}
	stored := s.NextOffset()
	if got := len(readAll(t, s, 0)); uint64(got) != stored {
		t.Fatalf("read back %d of %d records", got, stored)
	}
	t.Logf("%d records stored before the disk was full: %v", stored, lastErr)
	if stored < 1000 {
		t.Fatalf("only %d records fitted", stored)
	}
	if err := os.Remove(filler); err != nil { // space returns
		t.Fatal(err)
	}
	if _, err := s.Append(context.Background(), &Record{Topic: "a", Payload: payload}); err != nil {
		t.Fatalf("append once space returned: %v", err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st2 := openStore(t, cfg)
	if got := st2.Stream("default").NextOffset(); got != stored+1 {
		t.Fatalf("after reopen NextOffset %d, want %d", got, stored+1)
	}
}
