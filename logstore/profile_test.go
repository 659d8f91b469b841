package logstore

import (
	"math/bits"
	"testing"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// On 32-bit platforms every profile gets the options that keep each table
// inside one allocator buffer (see for32Bit); 64-bit platforms get the
// table as written. TestStore_IntegrityAfterReopen under qemu-arm is what
// shows the options keep data intact; this pins them.
func TestProfile_32BitOptions(t *testing.T) {
	for _, p := range []Profile{ProfilePiZero, ProfilePi, ProfileServer} {
		t.Run(string(p), func(t *testing.T) {
			s := profiles[p].for32Bit()
			o := s.badgerOptions()
			if o.Compression != options.None {
				t.Errorf("compression %v, want none", o.Compression)
			}
			if o.BaseTableSize < o.MemTableSize {
				t.Errorf("BaseTableSize %d below MemTableSize %d: a memtable flush would outgrow its allocator buffer", o.BaseTableSize, o.MemTableSize)
			}
			if o.TableSizeMultiplier != 1 {
				t.Errorf("TableSizeMultiplier %d, want 1", o.TableSizeMultiplier)
			}
			if o.ValueThreshold > int64(o.BlockSize)/4 {
				t.Errorf("ValueThreshold %d above a quarter of the %d-byte block", o.ValueThreshold, o.BlockSize)
			}
			if o.MemTableSize > 16*mib || o.ValueLogFileSize > 64*mib {
				t.Errorf("MemTableSize %d, ValueLogFileSize %d: want at most 16 MiB and 64 MiB", o.MemTableSize, o.ValueLogFileSize)
			}
			if o.BlockCacheSize != 0 {
				t.Errorf("block cache %d without compression", o.BlockCacheSize)
			}
			if s.memoryLimit != profiles[p].memoryLimit || s.minFree != profiles[p].minFree {
				t.Error("the memory limit or free-space reserve changed")
			}
			// Badger accepts them.
			dir := t.TempDir()
			db, err := badger.Open(o.WithDir(dir).WithValueDir(dir).WithLogger(nil))
			if err != nil {
				t.Fatalf("Open with the 32-bit options: %v", err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}

			got := p.spec()
			want := profiles[p]
			if bits.UintSize == 32 {
				want = want.for32Bit()
			}
			if got != want {
				t.Errorf("spec on this %d-bit platform = %+v, want %+v", bits.UintSize, got, want)
			}
		})
	}
}
