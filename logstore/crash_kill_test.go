package logstore

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

// killChildEnv names the directory a re-executed test binary writes a
// store to before it is killed (TestMain runs killChild instead of the
// tests).
const killChildEnv = "PEAT_LOGSTORE_KILL_CHILD_DIR"

// testExecEnv names the emulator the tests run under (scripts/test-arm.sh
// sets it to what it gives go test -exec): without binfmt_misc the kernel
// cannot exec the test binary again by itself.
const testExecEnv = "PEAT_TEST_EXEC"

func TestMain(m *testing.M) {
	if dir := os.Getenv(killChildEnv); dir != "" {
		killChild(dir)
		return
	}
	if spec := os.Getenv(killDeleteEnv); spec != "" {
		killDeleteChild(spec) // delete_test.go
		return
	}
	os.Exit(m.Run())
}

// killChildConfig is the store the killed child writes.
func killChildConfig(dir string) Config {
	return Config{Dir: dir, Profile: ProfilePiZero, ManualCommit: true, MinFreeBytes: -1, RetentionInterval: time.Hour,
		Streams: []StreamConfig{{Name: "default", Filters: []string{"#"}}}}
}

// killChild writes a replica's state, says "ready" and waits to be killed:
// epochs 3, 4 and 5, a high watermark, a truncation and a key.
func killChild(dir string) {
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	st, err := Open(killChildConfig(dir))
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	s := st.Stream("default")
	for _, step := range []struct {
		epoch uint32
		n     int
	}{{3, 100}, {4, 50}} {
		s.SetEpoch(step.epoch)
		for range step.n {
			if _, err := s.Append(ctx, rec("t", "p")); err != nil {
				fail(err)
			}
		}
	}
	if err := s.SetHighWatermark(ctx, 120); err != nil {
		fail(err)
	}
	if err := s.SyncHighWatermark(ctx); err != nil { // not left to the lazy write
		fail(err)
	}
	if err := s.Truncate(ctx, 140); err != nil {
		fail(err)
	}
	vals, _ := leaderValues(140, 10, 5)
	if err := s.AppendReplica(ctx, 140, vals); err != nil {
		fail(err)
	}
	if err := st.KVSet([]byte("term"), []byte("5")); err != nil {
		fail(err)
	}
	fmt.Println("ready")
	select {} // killed here
}

// A process killed with SIGKILL right after its writes returned leaves a
// store that opens with the same high watermark, leader-epoch cache, log
// end and keys.
func TestStore_KilledProcessKeepsReplicaState(t *testing.T) {
	dir := t.TempDir()
	args := []string{os.Args[0], "-test.run=^$"}
	if emu := os.Getenv(testExecEnv); emu != "" {
		args = append([]string{emu}, args...) // the child is a binary for the emulated CPU too
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), killChildEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child said %q, %v; want ready", line, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	st := openStore(t, killChildConfig(dir))
	s := st.Stream("default")
	if s.Committed() != 120 || s.NextOffset() != 150 {
		t.Fatalf("after kill -9 committed %d next %d, want 120 and 150", s.Committed(), s.NextOffset())
	}
	checkEpochs(t, s, []epochAnswer{{2, 2, 0, true}, {3, 3, 100, true}, {4, 4, 140, true}, {5, 5, 150, true}, {6, 0, 0, false}})
	if v, err := st.KVGet([]byte("term")); err != nil || string(v) != "5" {
		t.Fatalf("after kill -9 KVGet(term) = %q, %v; want 5", v, err)
	}
	if vals, err := s.ReadRaw(140, 0, 0); err != nil || len(vals) != 10 {
		t.Fatalf("after kill -9 ReadRaw(140) = %d values, %v; want 10", len(vals), err)
	}
}
