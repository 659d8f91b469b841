package logstore

import (
	"context"
	"errors"
	"testing"
	"time"
)

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// With ManualCommit an append wakes the replica fetch (Appended), not the
// readers (Changed): they would find nothing new below the watermark.
func TestStream_WakeUps(t *testing.T) {
	ctx := context.Background()
	t.Run("ManualCommit", func(t *testing.T) {
		s := openStore(t, manualConfig(t)).Stream("default")
		changed, appended := s.Changed(), s.Appended()
		appendN(t, s, 5, 5) // done runs after the notify: no race with the check below
		if isClosed(changed) {
			t.Fatal("an append woke Changed below an unmoved high watermark")
		}
		if !isClosed(appended) {
			t.Fatal("an append did not wake Appended")
		}
		appended = s.Appended()
		setHW(t, s, 3)
		if !isClosed(changed) {
			t.Fatal("SetHighWatermark did not wake Changed")
		}
		if isClosed(appended) {
			t.Fatal("SetHighWatermark woke Appended with the log end unmoved")
		}
		changed, appended = s.Changed(), s.Appended()
		if err := s.Truncate(ctx, 4); err != nil {
			t.Fatal(err)
		}
		if !isClosed(changed) || !isClosed(appended) {
			t.Fatal("a truncation did not wake both")
		}
	})
	t.Run("single node", func(t *testing.T) {
		s := openStore(t, testConfig(t)).Stream("default")
		changed, appended := s.Changed(), s.Appended()
		appendN(t, s, 5, 5)
		if !isClosed(changed) || !isClosed(appended) {
			t.Fatal("an append did not wake both")
		}
	})
	t.Run("WaitAppended", func(t *testing.T) {
		st := openStore(t, manualConfig(t))
		s := st.Stream("default")
		errc := make(chan error, 1)
		go func() { errc <- s.WaitAppended(ctx, 0) }()
		appendN(t, s, 1, 1)
		if err := <-errc; err != nil {
			t.Fatalf("WaitAppended(0) after an append = %v", err)
		}
		short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		if err := s.WaitAppended(short, 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitAppended(1) at log end 1 = %v, want the context's error", err)
		}
		go func() { errc <- s.WaitAppended(ctx, 1) }()
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; !errors.Is(err, ErrClosed) {
			t.Fatalf("WaitAppended across Close = %v, want ErrClosed", err)
		}
	})
}
